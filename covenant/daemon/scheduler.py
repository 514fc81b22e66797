"""Concurrency slots for dispatches: a global limit, per-agent limits, a bounded queue.

When the daemon is saturated, dispatches wait in priority order (high, normal,
low; FIFO within a priority). The queue is bounded: past ``queue_max`` a new
dispatch is refused as ``overloaded`` instead of waiting without end.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from covenant.errors import CovenantError, ExitCode
from covenant.priorities import PRIORITY_ORDER

__all__ = ["Scheduler", "Overloaded", "ShuttingDown", "Withdrawn"]


class Overloaded(CovenantError):
    """The wait queue is full: 503 with ``Retry-After`` (the daemon is fine, only busy; a slot
    frees as soon as any dispatch ends, so a short wait is the honest hint)."""

    code = "overloaded"
    exit_code = ExitCode.UNREACHABLE
    http_status = 503
    retry_after_s = 1


class ShuttingDown(CovenantError):
    code = "shutting_down"
    exit_code = ExitCode.UNREACHABLE
    http_status = 503


class Withdrawn(CovenantError):
    """A dispatch cancelled before its run started: before it queued, taken out of the queue
    (:meth:`Scheduler.withdraw`), or as its slot was granted."""

    code = "cancelled"
    exit_code = ExitCode.UNREACHABLE


@dataclass(order=True)
class _Waiter:
    rank: int
    seq: int
    agent_id: str = field(compare=False)
    child: bool = field(compare=False, default=False)
    key: str | None = field(compare=False, default=None)
    event: trio.Event = field(compare=False, default_factory=trio.Event)
    granted: bool = field(compare=False, default=False)
    refused: CovenantError | None = field(compare=False, default=None)


class Scheduler:
    """Hands out run slots; see the module docstring for the policy."""

    def __init__(self, *, max_concurrent: int, per_agent: int = 0, queue_max: int = 1000) -> None:
        self.max_concurrent = max_concurrent
        self.per_agent = per_agent
        self.queue_max = queue_max
        self._running: Counter[str] = Counter()
        self._total = 0
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()
        self._closed: CovenantError | None = None

    @property
    def in_flight(self) -> int:
        return self._total

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def _has_room(self, agent_id: str) -> bool:
        if self._total >= self.max_concurrent:
            return False
        return not self.per_agent or self._running[agent_id] < self.per_agent

    def _take(self, agent_id: str) -> None:
        self._total += 1
        self._running[agent_id] += 1

    def _release(self, agent_id: str) -> None:
        self._total -= 1
        self._running[agent_id] -= 1
        if not self._running[agent_id]:
            del self._running[agent_id]
        self._wake()

    def _wake(self) -> None:
        """Grant slots to the first waiters (in queue order) that fit."""
        index = 0
        while index < len(self._waiting) and self._total < self.max_concurrent:
            waiter = self._waiting[index]
            if self._has_room(waiter.agent_id):
                del self._waiting[index]
                self._take(waiter.agent_id)
                waiter.granted = True
                waiter.event.set()
            else:
                index += 1

    def can_start_now(self, agent_id: str) -> bool:
        """Would :meth:`slot` grant a slot for ``agent_id`` without queueing?"""
        return self._has_room(agent_id) and not any(self._has_room(w.agent_id) for w in self._waiting)

    @asynccontextmanager
    async def slot(
        self, agent_id: str, priority: str, *, child: bool = False, key: str | None = None
    ) -> AsyncIterator[None]:
        """Hold one run slot for ``agent_id`` for the duration of the block.

        ``child``: the run is a child intent of one already running (a workflow step, an agent tool), so
        part of work a drain lets finish: :meth:`close` refuses neither its slot nor its place in the queue.
        ``key`` (the intent id) names its place in the queue for :meth:`withdraw`.
        """
        if self._closed is not None and not child:
            raise self._closed
        if self.can_start_now(agent_id):
            self._take(agent_id)
        else:
            if len(self._waiting) >= self.queue_max:
                raise Overloaded(
                    f"the daemon is saturated: {self._total} dispatches running and {len(self._waiting)} "
                    f"queued (queue_max = {self.queue_max}); retry later",
                    in_flight=self._total,
                    queued=len(self._waiting),
                )
            waiter = _Waiter(PRIORITY_ORDER.get(priority, 1), next(self._seq), agent_id, child, key)
            bisect.insort(self._waiting, waiter)
            try:
                await waiter.event.wait()
            except BaseException:
                if waiter.granted:
                    self._release(agent_id)
                else:
                    self._waiting.remove(waiter)
                raise
            if waiter.refused is not None:
                raise waiter.refused
        try:
            yield
        finally:
            self._release(agent_id)

    def withdraw(self, key: str, error: CovenantError) -> bool:
        """Take the queued waiter ``key`` out of the queue; its :meth:`slot` raises ``error``. False when
        no waiter has that key (it got its slot, or never queued)."""
        for index, waiter in enumerate(self._waiting):
            if waiter.key == key:
                del self._waiting[index]
                waiter.refused = error
                waiter.event.set()
                return True
        return False

    def close(self, error: CovenantError) -> None:
        """Refuse new slots and every queued waiter with ``error`` (daemon shutdown); children excepted."""
        self._closed = error
        for waiter in self._waiting:
            if not waiter.child:
                waiter.refused = error
                waiter.event.set()
        self._waiting = [waiter for waiter in self._waiting if waiter.child]
