"""The audit writer for trio: group commit, acknowledgement only after fdatasync.

Callers ``await log.record(type, data)``; records queue up while the
previous batch is being synced, and the writer task takes everything queued
(up to ``batch_max``), writes it plus one signed checkpoint in one
``write()``, syncs in a worker thread, and only then wakes the callers. Under
light load each record gets its own checkpoint; under heavy load one
signature and one sync cover a whole batch.

If a write or sync fails the log is finished for this process: every caller
in that batch, every queued caller and every later caller gets
AuditUnavailable (fail closed). Retrying fsync on the same file and trusting
it would be wrong: after a failed fsync Linux may have dropped the dirty pages.
"""

from __future__ import annotations

import logging
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.errors import AuditUnavailable
from covenant.audit.events import encode_event_data
from covenant.audit.format import HEARTBEAT, timestamp
from covenant.audit.store import LogFiles, unavailable
from covenant.config import AuditConfig

__all__ = ["AuditLog"]

log = logging.getLogger("covenant.audit")

# How long closing waits for queued records before giving up on them.
_CLOSE_TIMEOUT_S = 30.0
# Longest head.json may lag behind the newest checkpoint while the log is open.
_HEAD_INTERVAL_S = 0.5


class _Pending:
    __slots__ = ("type", "data", "ts", "done", "seq", "error")

    def __init__(self, type_: str, data: bytes) -> None:
        self.type = type_
        self.data = data
        self.ts = timestamp()
        self.done = trio.Event()
        self.seq = -1
        self.error: AuditUnavailable | None = None


class AuditLog:
    """An open, signed, append-only audit log. Create with ``AuditLog.open``."""

    def __init__(
        self,
        files: LogFiles,
        config: AuditConfig,
        on_batch: Callable[[int, float], None] | None,
    ) -> None:
        self._files = files
        self._config = config
        self._on_batch = on_batch
        self._queue: list[_Pending] = []
        self._wakeup = trio.Event()
        self._idle = trio.Event()
        self._head_dirty = trio.Event()
        self._in_flight = False
        self._closing = False
        self._failure: str | None = None
        self._last_write = trio.current_time()

    # -- public face -----------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        directory: Path,
        key: Ed25519PrivateKey,
        config: AuditConfig,
        *,
        on_batch: Callable[[int, float], None] | None = None,
        fsync: Callable[[int], None] = os.fdatasync,
    ) -> AsyncIterator["AuditLog"]:
        """Open (or create) the log in ``directory``, recovering a torn tail, and run its writer.

        ``fsync`` is the OS boundary used to make data durable (tests pass one
        that fails). On exit, everything already queued is written first.

            async with AuditLog.open(home.audit_dir, key, config.audit) as audit:
                seq = await audit.record("daemon.start", {"pid": os.getpid()})
        """
        files = await trio.to_thread.run_sync(LogFiles.open, Path(directory), key, config.segment_bytes, fsync)
        if files.recovered is not None:
            log.warning(
                "audit log recovered from a torn tail",
                extra={"directory": str(directory), **files.recovered},
            )
        self = cls(files, config, on_batch)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_writer)
                nursery.start_soon(self._run_heartbeat)
                nursery.start_soon(self._run_head)
                try:
                    yield self
                finally:
                    with trio.CancelScope(shield=True):
                        await self._drain()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._close_files)

    async def record(self, type: str, data: dict[str, Any]) -> int:  # noqa: A002 - the public name is `type`
        """Append one event; returns its ``seq`` once it is durable and under a signed checkpoint.

        Raises AuditDataError for a bad type or data (floats, reserved
        ``audit.*`` types) and AuditUnavailable when the log cannot be written.
        If the caller is cancelled while waiting, the record may still be written.
        """
        return (await self.record_many([(type, data)]))[0]

    async def record_many(self, events: list[tuple[str, dict[str, Any]]]) -> list[int]:
        """Append several events in order, in one group commit when they fit a batch.

        Same guarantees as :meth:`record` for each event: all are durable and
        checkpointed when this returns. The daemon writes an intent's
        ``intent.received`` and ``policy.decision`` together this way, paying
        for one fsync instead of two before the agent may start.
        """
        if self._failure is not None:
            raise AuditUnavailable(self._failure, path=str(self._files.directory))
        if self._closing:
            raise AuditUnavailable("the audit log is closed", path=str(self._files.directory))
        return await self._enqueue([_Pending(type_, encode_event_data(type_, data)) for type_, data in events])

    @property
    def healthy(self) -> bool:
        return self._failure is None and not self._closing

    @property
    def failure(self) -> str | None:
        """Why the log cannot be written, or None."""
        return self._failure

    @property
    def head(self) -> dict[str, Any] | None:
        """The latest checkpoint (what head.json holds, possibly a few ms newer)."""
        return dict(self._files.head) if self._files.head else None

    @property
    def public_key_hex(self) -> str:
        return self._files.pubkey_hex

    @property
    def recovered(self) -> dict[str, Any] | None:
        """The data of the audit.recover record written when this log was opened, if any."""
        return self._files.recovered

    # -- machinery -------------------------------------------------------------

    async def _enqueue(self, items: list[_Pending]) -> list[int]:
        self._queue.extend(items)  # no await between: the events stay adjacent and in order
        self._wakeup.set()
        for item in items:
            await item.done.wait()
        for item in items:
            if item.error is not None:
                raise item.error
        return [item.seq for item in items]

    async def _run_writer(self) -> None:
        batch_max = self._config.batch_max
        linger = self._config.batch_wait_ms / 1000
        while True:
            if not self._queue:
                self._idle.set()
                self._wakeup = trio.Event()
                await self._wakeup.wait()
            if linger and len(self._queue) < batch_max:
                await trio.sleep(linger)
            batch = self._queue[:batch_max]
            del self._queue[:batch_max]
            self._in_flight = True
            try:
                first, fsync_s = await trio.to_thread.run_sync(
                    self._files.append, [(p.type, p.data, p.ts) for p in batch]
                )
            except OSError as exc:
                self._fail(exc, batch)
                return
            finally:
                self._in_flight = False
            for n, item in enumerate(batch):
                item.seq = first + n
                item.done.set()
            self._last_write = trio.current_time()
            self._head_dirty.set()
            if self._on_batch is not None:
                try:
                    self._on_batch(len(batch), fsync_s)
                except Exception:  # a metrics hook must never take the audit log down
                    log.exception("audit on_batch hook failed")

    def _fail(self, exc: OSError, batch: list[_Pending]) -> None:
        error = unavailable(self._files.directory, exc)
        self._failure = error.message
        log.error(
            "audit log write failed: refusing further records (fail closed)",
            extra={"directory": str(self._files.directory), "error": str(exc), "records_lost": len(batch)},
        )
        for item in batch + self._queue:
            item.error = error
            item.done.set()
        self._queue.clear()
        self._idle.set()

    async def _run_heartbeat(self) -> None:
        """Write a heartbeat record + checkpoint after ``heartbeat_s`` without writes."""
        interval = self._config.heartbeat_s
        while self._failure is None:
            await trio.sleep_until(self._last_write + interval)
            if trio.current_time() - self._last_write >= interval and self._failure is None and not self._closing:
                try:
                    await self._enqueue([_Pending(HEARTBEAT, b"{}")])
                except AuditUnavailable:
                    return

    async def _run_head(self) -> None:
        """Keep head.json current without putting its two fsyncs on the ack path.

        At most one update per _HEAD_INTERVAL_S: under a steady trickle of
        single events, updating after every batch would triple the syncs per
        event. head.json is rewritten on close as well.
        """
        while True:
            await self._head_dirty.wait()
            self._head_dirty = trio.Event()
            try:
                await trio.to_thread.run_sync(self._files.write_head)
            except OSError as exc:
                self._fail(exc, [])
                return
            await trio.sleep(_HEAD_INTERVAL_S)

    async def _drain(self) -> None:
        self._closing = True
        with trio.move_on_after(_CLOSE_TIMEOUT_S):
            while (self._queue or self._in_flight) and self._failure is None:
                self._idle = trio.Event()
                await self._idle.wait()

    def _close_files(self) -> None:
        try:
            if self._failure is None:
                self._files.write_head()
        except OSError as exc:
            log.error("audit head.json could not be written on close", extra={"error": str(exc)})
        finally:
            self._files.close()

