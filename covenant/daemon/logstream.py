"""Recent daemon log events in memory, and live subscriptions for ``covenant logs -f``.

:class:`LogBroadcaster` is a logging handler: attach it to the ``covenant``
logger and it keeps the last N events as field dicts (see
:func:`covenant.logs.record_fields`) and fans new ones out to trio
subscribers. Logging happens on the trio thread and on worker threads alike,
so delivery always hops onto the trio loop through the run's TrioToken; a
subscriber that reads too slowly loses lines (and is told how many) instead
of ever slowing the daemon down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import trio

from covenant.logs import LEVELS, iso_timestamp, record_fields

__all__ = ["LogBroadcaster", "LogSubscription", "DEFAULT_CAPACITY", "DEFAULT_SUBSCRIBER_BUFFER"]

DEFAULT_CAPACITY = 1000
DEFAULT_SUBSCRIBER_BUFFER = 256

Entry = dict[str, Any]


def _level_no(level: str | None) -> int:
    if level is None:
        return 0
    try:
        return LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(LEVELS)}") from None


def _matches(entry: Entry, agent: str | None, min_level: int) -> bool:
    if agent is not None and entry.get("agent") != agent:
        return False
    return LEVELS.get(str(entry.get("level")), 0) >= min_level


class LogSubscription:
    """Live events for one reader; async-iterate it, close it when done.

    Lives on the trio thread: ``_deliver`` runs there (scheduled by the
    broadcaster), so its buffer needs no lock. When the buffer is full new
    events are counted, not queued; the count comes out as one marker event
    ``{"level": "warning", "msg": "dropped N lines …", "dropped": N}`` at the
    point where the gap is.
    """

    def __init__(self, owner: "LogBroadcaster", agent: str | None, min_level: int, buffer: int) -> None:
        self._owner = owner
        self._agent = agent
        self._min_level = min_level
        self._capacity = buffer
        self._buffer: deque[Entry] = deque()
        self._dropped = 0
        self._closed = False
        self._lot = trio.lowlevel.ParkingLot()

    def _marker(self) -> Entry:
        count, self._dropped = self._dropped, 0
        return {
            "ts": iso_timestamp(time.time()),
            "level": "warning",
            "logger": "covenant.logstream",
            "msg": f"dropped {count} lines: this reader was too slow",
            "dropped": count,
        }

    def _deliver(self, entry: Entry) -> None:
        if self._closed or not _matches(entry, self._agent, self._min_level):
            return
        if len(self._buffer) >= self._capacity:
            self._dropped += 1
            return
        if self._dropped:
            self._buffer.append(self._marker())
        self._buffer.append(entry)
        self._lot.unpark_all()

    def _end(self) -> None:
        self._closed = True
        self._lot.unpark_all()

    def close(self) -> None:
        """Stop receiving; iteration ends once the buffered events are read."""
        self._owner._unsubscribe(self)
        self._end()

    def __aiter__(self) -> "LogSubscription":
        return self

    async def __anext__(self) -> Entry:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._buffer or self._dropped or self._closed:
            await trio.lowlevel.cancel_shielded_checkpoint()
        else:
            # Cancellation can only strike while parked, before anything is taken.
            while not (self._buffer or self._dropped or self._closed):
                await self._lot.park()
        if self._buffer:
            return self._buffer.popleft()
        if self._dropped:
            return self._marker()
        raise StopAsyncIteration

    async def __aenter__(self) -> "LogSubscription":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class LogBroadcaster(logging.Handler):
    """A logging handler that remembers recent events and streams new ones.

    Example::

        broadcaster = LogBroadcaster()
        logging.getLogger("covenant").addHandler(broadcaster)
        ...
        async with broadcaster.subscribe(agent="summarize", backlog=50) as events:
            async for event in events:
                send_sse(event)
    """

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        subscriber_buffer: int = DEFAULT_SUBSCRIBER_BUFFER,
        level: int = logging.NOTSET,
    ) -> None:
        super().__init__(level)
        if capacity <= 0 or subscriber_buffer <= 0:
            raise ValueError("capacity and subscriber_buffer must be positive")
        self._ring: deque[Entry] = deque(maxlen=capacity)
        self._subscriber_buffer = subscriber_buffer
        self._subscribers: set[LogSubscription] = set()
        self._token: trio.lowlevel.TrioToken | None = None
        self._seq = 0
        # Guards ring, seq, subscribers and token; emit() comes from any thread.
        self._state_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            entry = record_fields(record)
        except Exception:
            self.handleError(record)
            return
        with self._state_lock:
            self._seq += 1
            entry["seq"] = self._seq
            self._ring.append(entry)
            if not self._subscribers or self._token is None:
                return
            targets = tuple(self._subscribers)
            try:
                # FIFO and called under the lock: subscribers see seq order.
                self._token.run_sync_soon(self._fan_out, targets, entry)
            except trio.RunFinishedError:
                self._subscribers.clear()
                self._token = None

    @staticmethod
    def _fan_out(targets: Iterable[LogSubscription], entry: Entry) -> None:
        for subscription in targets:
            subscription._deliver(entry)

    def recent(self, agent: str | None = None, level: str | None = None, limit: int | None = None) -> list[Entry]:
        """Buffered events, oldest first, filtered by agent id and minimum level."""
        min_level = _level_no(level)
        with self._state_lock:
            snapshot = list(self._ring)
        found = [dict(e) for e in snapshot if _matches(e, agent, min_level)]
        return found[-limit:] if limit else found

    def subscribe(
        self,
        agent: str | None = None,
        level: str | None = None,
        backlog: int = 0,
        buffer: int | None = None,
    ) -> LogSubscription:
        """A live feed of new events (optionally preceded by the last ``backlog`` matches).

        Must be called from the trio thread. Use as ``async with`` or close() it;
        the backlog and the live feed never overlap or leave a gap.
        """
        min_level = _level_no(level)
        token = trio.lowlevel.current_trio_token()
        subscription = LogSubscription(self, agent, min_level, buffer or self._subscriber_buffer)
        with self._state_lock:
            if self._token is not token:
                # A new trio run (e.g. the daemon restarted in-process): the old
                # run's subscribers can no longer be woken.
                self._subscribers.clear()
                self._token = token
            if backlog > 0:
                matches = [e for e in self._ring if _matches(e, agent, min_level)]
                for entry in matches[-backlog:]:
                    subscription._buffer.append(dict(entry))
                # The backlog must not eat the room meant for live events.
                subscription._capacity += len(subscription._buffer)
            self._subscribers.add(subscription)
        return subscription

    @staticmethod
    def _end_all(targets: Iterable[LogSubscription]) -> None:
        for subscription in targets:
            subscription._end()

    def _unsubscribe(self, subscription: LogSubscription) -> None:
        with self._state_lock:
            self._subscribers.discard(subscription)

    def close(self) -> None:
        """End every subscription (their iterators finish), then close the handler."""
        with self._state_lock:
            targets = tuple(self._subscribers)
            self._subscribers.clear()
            token = self._token
        if targets and token is not None:
            try:
                token.run_sync_soon(self._end_all, targets)
            except trio.RunFinishedError:
                pass
        super().close()
