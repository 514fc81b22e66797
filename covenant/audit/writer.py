"""The audit writer for trio: group commit, acknowledgement only after fdatasync.

Callers ``await log.record(type, data)``; records queue up while the
previous batch is being synced, and a dedicated writer thread takes
everything queued (up to ``batch_max``), writes it plus one signed checkpoint
in one ``write()``, syncs, and only then hands the batch back to the trio
thread, which wakes the callers. Under light load each record gets its own
checkpoint; under heavy load one signature and one sync cover a whole batch.

The thread is fed directly (a deque and a condition) rather than through a
trio task and ``trio.to_thread`` per batch: each of those hops costs
~0.1-0.2 ms on the reference box, and a dispatch waits for two commits.

If a write or sync fails, every caller in that batch, every queued caller
and every later caller gets AuditUnavailable (fail closed). Retrying fsync on
the same file and trusting it would be wrong: after a failed fsync Linux may
have dropped the dirty pages. Instead the log is reopened from disk (with
backoff, 1 s doubling to 30 s): the tail is walked again, whatever did not
reach the disk whole is cut with an ``audit.recover`` record, and an
``audit.resume`` record says how long the log was down and how many records
were refused. Only then are records accepted again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.errors import AuditLogError, AuditUnavailable
from covenant.audit.events import encode_event_data
from covenant.audit.format import HEARTBEAT, RESUME, timestamp
from covenant.audit.store import LogFiles, unavailable
from covenant.canonical import canonical_bytes
from covenant.config import AuditConfig

__all__ = ["AuditLog"]

log = logging.getLogger("covenant.audit")

# How long closing waits for queued records before giving up on them.
_CLOSE_TIMEOUT_S = 30.0
# Longest head.json may lag behind the newest checkpoint while the log is open.
_HEAD_INTERVAL_S = 0.5
# Reopening a failed log: first try after this long, doubling up to the cap.
_REOPEN_FIRST_S = 1.0
_REOPEN_MAX_S = 30.0


def _report_repairs(files: LogFiles) -> None:
    """Log what opening the files had to repair (a torn tail cut, a damaged segment sealed)."""
    if files.recovered is not None:
        log.warning("audit log recovered from a torn tail", extra={"directory": str(files.directory), **files.recovered})
    if files.sealed is not None:
        log.error(
            "audit log segment sealed: bytes after the chain's end were not written by this daemon",
            extra={"directory": str(files.directory), **files.sealed},
        )
        files.sealed = None


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
        self._token = trio.lowlevel.current_trio_token()
        # Shared with the writer thread, under _wake:
        self._wake = threading.Condition()
        self._queue: deque[_Pending] = deque()
        self._stop = False
        # Trio thread only:
        self._unacked = 0
        self._settled = trio.Event()
        self._settled.set()
        self._closing = False
        self._failure: str | None = None
        self._failed = trio.Event()  # set while _failure is; the reopen task waits on it
        self._failed_at = 0.0
        self._refused = 0  # records refused since the failure, for the audit.resume record
        self._last_write = trio.current_time()
        self._thread = self._new_thread()

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
        try:
            files = await trio.to_thread.run_sync(LogFiles.open, Path(directory), key, config.segment_bytes, fsync)
        except OSError as exc:
            raise AuditUnavailable(
                f"audit log {directory} cannot be opened ({exc.strerror or exc}); free space or fix the disk, "
                f"then start the daemon again",
                path=str(directory),
            ) from None
        _report_repairs(files)
        self = cls(files, config, on_batch)
        self._thread.start()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_heartbeat)
                nursery.start_soon(self._run_reopen)
                try:
                    yield self
                finally:
                    with trio.CancelScope(shield=True):
                        await self._drain()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._stop_thread()

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
        ``intent.received``, ``policy.decision`` and ``agent.spawned``
        together this way, paying for one fsync instead of three before the
        agent may start.
        """
        self.check_writable()
        return await self._enqueue([_Pending(type_, encode_event_data(type_, data)) for type_, data in events])

    def check_writable(self) -> None:
        """Raise AuditUnavailable if records would be refused (a failed write, or closing)."""
        if self._failure is not None:
            self._refused += 1
            raise AuditUnavailable(self._failure, path=str(self._files.directory))
        if self._closing:
            raise AuditUnavailable("the audit log is closed", path=str(self._files.directory))

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

    # -- the trio side -----------------------------------------------------------

    async def _enqueue(self, items: list[_Pending]) -> list[int]:
        if not self._unacked:
            self._settled = trio.Event()
        self._unacked += len(items)
        with self._wake:
            self._queue.extend(items)  # one extend: the events stay adjacent and in order
            self._wake.notify()
        # Batches are acknowledged (or failed) in order, so the last item's event covers them all.
        await items[-1].done.wait()
        for item in items:
            if item.error is not None:
                raise item.error
        return [item.seq for item in items]

    def _acknowledge(self, batch: list[_Pending], first: int, fsync_s: float) -> None:
        """Run in the trio thread once ``batch`` is durable: wake its callers."""
        for n, item in enumerate(batch):
            item.seq = first + n
            item.done.set()
        self._settle(len(batch))
        self._last_write = trio.current_time()
        if self._on_batch is not None:
            try:
                self._on_batch(len(batch), fsync_s)
            except Exception:  # a metrics hook must never take the audit log down
                log.exception("audit on_batch hook failed")

    def _fail(self, exc: OSError, batch: list[_Pending]) -> None:
        """Run in the trio thread after a write or sync failed: refuse everything from now on."""
        error = unavailable(self._files.directory, exc)
        self._failure = error.message
        self._failed_at = trio.current_time()
        self._failed.set()
        with self._wake:
            queued = list(self._queue)
            self._queue.clear()
        log.error(
            "audit log write failed: refusing further records (fail closed)",
            extra={"directory": str(self._files.directory), "error": str(exc), "records_lost": len(batch)},
        )
        for item in batch + queued:
            item.error = error
            item.done.set()
        self._refused += len(batch) + len(queued)
        self._settle(len(batch) + len(queued))

    def _settle(self, count: int) -> None:
        self._unacked -= count
        if not self._unacked:
            self._settled.set()

    async def _run_heartbeat(self) -> None:
        """Write a heartbeat record + checkpoint after ``heartbeat_s`` without writes."""
        interval = self._config.heartbeat_s
        while True:
            due = self._last_write + interval
            if not self.healthy:
                due = max(due, trio.current_time() + interval)
            await trio.sleep_until(due)
            if trio.current_time() - self._last_write >= interval and self.healthy:
                with contextlib.suppress(AuditUnavailable):
                    await self._enqueue([_Pending(HEARTBEAT, b"{}")])

    async def _run_reopen(self) -> None:
        """After each failure: reopen the log from disk with backoff, then accept records again."""
        while True:
            await self._failed.wait()
            delay = _REOPEN_FIRST_S
            while True:
                await trio.sleep(delay)
                if self._closing:
                    return
                try:
                    await trio.to_thread.run_sync(self._reopen_files)
                except (OSError, AuditLogError) as exc:
                    log.warning(
                        "audit log still cannot be written; retrying",
                        extra={"directory": str(self._files.directory), "error": str(exc), "retry_s": delay},
                    )
                    delay = min(delay * 2, _REOPEN_MAX_S)
                    continue
                break
            await self._resume_after_reopen()

    def _reopen_files(self) -> None:
        """Worker thread: wait for the failed writer thread to end, then reopen the files from disk."""
        self._thread.join()
        self._files.reopen()
        _report_repairs(self._files)

    async def _resume_after_reopen(self) -> None:
        down_ms = int((trio.current_time() - self._failed_at) * 1000)
        resume = canonical_bytes({"error": self._failure or "", "down_ms": down_ms, "refused": self._refused})
        self._failure = None
        self._failed = trio.Event()
        self._refused = 0
        self._thread = self._new_thread()
        self._thread.start()
        log.warning(
            "audit log writable again; accepting records",
            extra={"directory": str(self._files.directory), "down_ms": down_ms},
        )
        with contextlib.suppress(AuditUnavailable):  # a new failure starts the next round
            await self._enqueue([_Pending(RESUME, resume)])

    def _new_thread(self) -> threading.Thread:
        return threading.Thread(target=self._write_batches, name="covenant-audit-writer", daemon=True)

    async def _drain(self) -> None:
        self._closing = True
        with trio.move_on_after(_CLOSE_TIMEOUT_S):
            await self._settled.wait()

    async def _stop_thread(self) -> None:
        """Stop the writer (it writes head.json last) and close the files."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        await trio.to_thread.run_sync(self._thread.join, _CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            log.error("the audit writer did not stop (a sync is hanging); its files stay open")
            return
        self._files.close()

    # -- the writer thread ---------------------------------------------------------

    def _next_batch(self, head_dirty: bool, last_head: float) -> list[_Pending] | None:
        """Wait for records; None once stopped and empty. Returns [] when head.json is due."""
        batch_max = self._config.batch_max
        with self._wake:
            while not self._queue:
                if self._stop:
                    return None
                if head_dirty:
                    due = last_head + _HEAD_INTERVAL_S - time.monotonic()
                    if due <= 0 or not self._wake.wait(due):
                        return []
                else:
                    self._wake.wait()
            return [self._queue.popleft() for _ in range(min(batch_max, len(self._queue)))]

    def _write_batches(self) -> None:
        """The writer thread: append batches, keep head.json at most _HEAD_INTERVAL_S behind."""
        linger = self._config.batch_wait_ms / 1000
        head_dirty = False
        last_head = time.monotonic()
        try:
            while (batch := self._next_batch(head_dirty, last_head)) is not None:
                if batch:
                    if linger and len(batch) < self._config.batch_max:
                        time.sleep(linger)
                        with self._wake:
                            while self._queue and len(batch) < self._config.batch_max:
                                batch.append(self._queue.popleft())
                    try:
                        first, fsync_s = self._files.append([(p.type, p.data, p.ts) for p in batch])
                    except OSError as exc:
                        self._token.run_sync_soon(self._fail, exc, batch)
                        return
                    self._token.run_sync_soon(self._acknowledge, batch, first, fsync_s)
                    if self._files.sealed is not None:
                        _report_repairs(self._files)
                    head_dirty = True
                if head_dirty and time.monotonic() - last_head >= _HEAD_INTERVAL_S:
                    self._files.write_head()
                    head_dirty, last_head = False, time.monotonic()
            if head_dirty:
                self._files.write_head()
        except OSError as exc:  # head.json: the same fail-closed rule as the log itself
            self._token.run_sync_soon(self._fail, exc, [])
