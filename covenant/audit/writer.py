"""The audit log for trio: group commit in a writer process, acknowledgement only after fdatasync.

Callers ``await log.record(type, data)``. The event loop encodes the event's
data, sends the record to the audit writer process
(:mod:`covenant.audit.writer_process`) over a socketpair, and waits. That
process takes everything queued (up to ``batch_max``), writes it plus one
signed checkpoint in one ``write()``, syncs, and answers; only then are the
callers woken. Under light load each record gets its own checkpoint; under
heavy load one signature and one sync cover a whole batch.

Why a process and not a thread: hashing, signing and writing took about a
sixth of the daemon's CPU per dispatch, and in a thread they competed with
the event loop for the GIL. In their own process they run on the second core
(docs/performance.md, "Fourth round").

If a write or sync fails, every record in flight and every later one gets
AuditUnavailable (fail closed), and the writer process ends. Retrying fsync
on the same file and trusting it would be wrong: after a failed fsync Linux
may have dropped the dirty pages. Instead a new writer process reopens the
log from disk (with backoff, 1 s doubling to 30 s): the tail is walked again,
whatever did not reach the disk whole is cut with an ``audit.recover``
record, and an ``audit.resume`` record says how long the log was down and how
many records were refused. Only then are records accepted again. A writer
process that dies is such a failure too.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import covenant
from covenant.audit.channel import PROTOCOL, dispatch_frame, event_frame, frame, log_call
from covenant.audit.errors import AuditDataError, AuditEventReplaced, AuditLogError, AuditUnavailable
from covenant.audit.events import encode_event_data
from covenant.audit.format import AUDIT_ERROR, HEARTBEAT, RESUME, timestamp
from covenant.audit.store import unavailable
from covenant.canonical import canonical_bytes
from covenant.config import AuditConfig
from covenant.outside_json import scrub

__all__ = ["AuditLog", "WRITER_COMMAND"]

log = logging.getLogger("covenant.audit")

# The writer process; its file descriptor and the daemon's pid are appended. -P: never import from
# the daemon's working directory (the writer holds the key); -s: nor from a user's site-packages.
WRITER_COMMAND: tuple[str, ...] = (sys.executable, "-P", "-s", "-m", "covenant.audit.writer_process")
# How long closing waits for queued records, and then for the writer to exit.
_CLOSE_TIMEOUT_S = 30.0
# Reopening a failed log: first try after this long, doubling up to the cap.
_REOPEN_FIRST_S = 1.0
_REOPEN_MAX_S = 30.0
# How much of an unencodable event's type, intent and error an audit.error record keeps.
_ERROR_FIELD_MAX = 256
_ERROR_TEXT_MAX = 1024


def _error_event(type_: object, data: object, exc: AuditDataError) -> bytes:
    """The ``audit.error`` data recorded in place of an event that could not be encoded: its type, its
    ``intent`` (when a string) and why, each cut short and with lone surrogates replaced, so it always encodes."""
    intent = data.get("intent") if isinstance(data, dict) else None
    return encode_event_data(AUDIT_ERROR, {
        "event_type": scrub(type_ if isinstance(type_, str) else repr(type_))[:_ERROR_FIELD_MAX],
        "intent": scrub(intent)[:_ERROR_FIELD_MAX] if isinstance(intent, str) else None,
        "error": scrub(exc.message)[:_ERROR_TEXT_MAX],
    }, writer=True)


def _report_repairs(directory: Path, recovered: dict[str, Any] | None, sealed: dict[str, Any] | None) -> None:
    """Log what opening or appending had to repair (a torn tail cut, a damaged segment sealed)."""
    if recovered is not None:
        log.warning("audit log recovered from a torn tail", extra={"directory": str(directory), **recovered})
    if sealed is not None:
        log.error(
            "audit log segment sealed: bytes after the chain's end were not written by this daemon",
            extra={"directory": str(directory), **sealed},
        )


def _writer_environment() -> dict[str, str]:
    """Only what the writer needs to import covenant: none of the daemon's variables (provider keys)."""
    return {"PYTHONPATH": str(Path(covenant.__file__).resolve().parent.parent), "PATH": os.defpath}


class _Pending:
    """One frame sent to the writer: an audit record (``event``) or a dispatch record's line."""

    __slots__ = ("frame", "event", "done", "seq", "error")

    def __init__(self, frame: bytes, event: bool) -> None:
        self.frame = frame
        self.event = event
        self.done = trio.Event()
        self.seq = -1
        self.error: AuditUnavailable | None = None

    @classmethod
    def record(cls, type_: str, data: bytes) -> "_Pending":
        return cls(event_frame(type_, timestamp(), data), True)


class _WriterProcess:
    """One running writer process and the daemon's end of its socket."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.process = process
        self._sock = sock
        self._received = b""
        self._outbox = bytearray()
        self._outbox_filled = trio.Event()

    @classmethod
    async def start(cls, command: Sequence[str], hello: dict[str, Any]) -> tuple["_WriterProcess", dict[str, Any]]:
        """Start a writer and open the log in it; returns it and its ``opened`` answer.

        Raises AuditLogError (the log on disk cannot be used as it is) or
        OSError (the disk fails, or the process could not start).
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            try:
                process = subprocess.Popen(
                    [*command, str(theirs.fileno()), str(os.getpid())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    env=_writer_environment(),
                )
            except OSError:
                ours.close()
                raise
        ours.setblocking(False)
        self = cls(process, ours)
        self.send(frame(json.dumps(hello).encode()))
        answer = await self.receive()
        if answer and "opened" in answer[0]:
            return self, answer[0]["opened"]
        await self.stop(timeout=_CLOSE_TIMEOUT_S)
        problem = answer[0].get("error") if answer else None
        if problem is None:
            raise OSError(errno.EIO, f"the audit writer process exited at start (status {self.process.returncode})")
        if problem["kind"] == "log":
            raise AuditLogError(problem["message"], path=hello["directory"])
        raise OSError(problem["errno"], problem["strerror"])

    def send(self, data: bytes) -> None:
        """Send at once if the socket takes it; whatever does not fit waits for :meth:`flush`."""
        if self._outbox:
            self._outbox += data
            return
        try:
            sent = self._sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:  # the writer is gone: its end of file fails everything in flight
            return
        if sent < len(data):
            self._outbox += data[sent:]
            self._outbox_filled.set()

    def send_soon(self, data: bytes) -> None:
        """Queue ``data`` for :meth:`flush`, which sends it with every frame the loop's other tasks queue before
        it runs: under load one write (and one wake-up of the writer) carries many records instead of one
        each. It runs in the loop's next pass, so a lone record waits no longer than one task switch."""
        self._outbox += data
        self._outbox_filled.set()

    async def flush(self) -> None:
        """Forever: send what :meth:`send` could not and what :meth:`send_soon` queued, as the writer makes room."""
        while True:
            await self._outbox_filled.wait()
            self._outbox_filled = trio.Event()
            while self._outbox:
                try:
                    sent = self._sock.send(self._outbox)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self._sock)
                    continue
                except OSError:
                    self._outbox.clear()
                    break
                del self._outbox[:sent]

    async def receive(self) -> list[dict[str, Any]]:
        """The writer's next messages; [] once it has closed its end."""
        while True:
            await trio.lowlevel.wait_readable(self._sock)
            try:
                chunk = self._sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return []
            *lines, self._received = (self._received + chunk).split(b"\n")
            if lines:
                return [json.loads(line) for line in lines]

    async def stop(self, timeout: float) -> None:
        """End of file to the writer: it writes what it has, then head.json, and exits."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        try:
            await trio.to_thread.run_sync(self.process.wait, timeout, abandon_on_cancel=True)
        except subprocess.TimeoutExpired:
            log.error("the audit writer did not stop (a sync is hanging); killing it", extra={"pid": self.process.pid})
            self.process.kill()
            await trio.to_thread.run_sync(self.process.wait, abandon_on_cancel=True)
        finally:
            self._sock.close()


class AuditLog:
    """An open, signed, append-only audit log. Create with ``AuditLog.open``."""

    def __init__(
        self,
        directory: Path,
        key: Ed25519PrivateKey,
        config: AuditConfig,
        on_batch: Callable[[int, float], None] | None,
        command: Sequence[str],
        dispatches: Path | None,
    ) -> None:
        self._directory = directory
        self._hello = {
            "protocol": PROTOCOL,
            "directory": str(directory),
            "key": key.private_bytes_raw().hex(),
            "segment_bytes": config.segment_bytes,
            "batch_max": config.batch_max,
            "batch_wait_ms": config.batch_wait_ms,
            "dispatches": str(dispatches) if dispatches is not None else None,
        }
        self._config = config
        self._on_batch = on_batch
        self._command = command
        self._writer: _WriterProcess | None = None
        self._opened: dict[str, Any] = {}
        self._head: dict[str, Any] = {}
        self._in_flight: deque[_Pending] = deque()  # sent, not yet acknowledged, in order
        self._settled = trio.Event()
        self._settled.set()
        self._closing = False
        self._failure: str | None = None
        self._failed_at = 0.0
        self._refused = 0  # records refused since the failure, for the audit.resume record
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
        writer: Sequence[str] = WRITER_COMMAND,
        dispatches: Path | None = None,
    ) -> AsyncIterator["AuditLog"]:
        """Open (or create) the log in ``directory``, recovering a torn tail, and run its writer.

        ``writer`` is the writer process's command (tests start one whose
        fsync fails). With ``dispatches`` (the dispatch records' directory),
        :meth:`record_many` also takes a dispatch record. On exit, everything
        already queued is written first.

            async with AuditLog.open(home.audit_dir, key, config.audit) as audit:
                seq = await audit.record("daemon.start", {"pid": os.getpid()})
        """
        self = cls(Path(directory), key, config, on_batch, writer, dispatches)
        try:
            await self._start_writer()
        except OSError as exc:
            raise AuditUnavailable(
                f"audit log {directory} cannot be opened ({exc.strerror or exc}); free space or fix the disk, "
                f"then start the daemon again",
                path=str(directory),
            ) from None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_heartbeat)
                nursery.start_soon(self._run_writers)
                try:
                    yield self
                finally:
                    with trio.CancelScope(shield=True):
                        await self._drain()
                    nursery.cancel_scope.cancel()
        finally:
            if self._writer is not None:
                with trio.CancelScope(shield=True):
                    await self._writer.stop(timeout=_CLOSE_TIMEOUT_S)

    async def record(self, type: str, data: dict[str, Any]) -> int:  # noqa: A002 - the public name is `type`
        """Append one event; returns its ``seq`` once it is durable and under a signed checkpoint.

        An event that cannot be encoded (floats, text that is not valid Unicode, a reserved ``audit.*``
        type) is recorded as ``audit.error`` instead and :class:`AuditEventReplaced` is raised once that is
        durable; AuditUnavailable when the log cannot be written.
        If the caller is cancelled while waiting, the record may still be written.
        """
        return (await self.record_many([(type, data)]))[0]

    async def record_many(
        self, events: list[tuple[str, dict[str, Any]]], *, dispatch_record: bytes | None = None
    ) -> list[int]:
        """Append several events in order, in one group commit when they fit a batch.

        Same guarantees as :meth:`record` for each event: all are durable and
        checkpointed when this returns. The daemon writes an intent's
        ``intent.received``, ``policy.decision`` and ``agent.spawned``
        together this way, paying for one fsync instead of three before the
        agent may start. ``dispatch_record`` (a line of
        :func:`~covenant.runtime.records.encode_record`) is appended to the
        dispatch records in the same commit and is durable too on return; the
        log must have been opened with ``dispatches``.

        Nothing is dropped silently: an event that cannot be encoded is recorded as ``audit.error``
        (``event_type``, ``intent``, ``error``) in its place, the others and the dispatch record are
        written as asked, and then :class:`AuditEventReplaced` is raised, naming what was replaced.
        """
        self.check_writable()
        items: list[_Pending] = []
        replaced: list[tuple[str, str]] = []
        for type_, data in events:
            try:
                items.append(_Pending.record(type_, encode_event_data(type_, data)))
            except AuditDataError as exc:
                items.append(_Pending.record(AUDIT_ERROR, _error_event(type_, data, exc)))
                replaced.append((str(type_), exc.message))
        if dispatch_record is not None:
            if self._hello["dispatches"] is None:
                raise ValueError("this audit log was opened without a dispatch records directory")
            items.append(_Pending(dispatch_frame(dispatch_record), False))
        self._submit(items)
        # Batches are acknowledged (or failed) in order, so the last item's event covers them all.
        await items[-1].done.wait()
        for item in items:
            if item.error is not None:
                raise item.error
        seqs = [item.seq for item in items if item.event]
        if replaced:
            log.error("audit events could not be encoded; recorded as audit.error",
                      extra={"types": ",".join(t for t, _ in replaced), "error": scrub(replaced[0][1])[:_ERROR_TEXT_MAX]})
            raise AuditEventReplaced(
                f"{len(replaced)} audit event(s) could not be encoded and were recorded as audit.error: "
                f"{scrub(replaced[0][0])}: {scrub(replaced[0][1])}",
                replaced=tuple(t for t, _ in replaced),
            )
        return seqs

    def check_writable(self) -> None:
        """Raise AuditUnavailable if records would be refused (a failed write, or closing)."""
        if self._failure is not None:
            self._refused += 1
            raise AuditUnavailable(self._failure, path=str(self._directory))
        if self._closing:
            raise AuditUnavailable("the audit log is closed", path=str(self._directory))

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
        return dict(self._head) if self._head else None

    @property
    def public_key_hex(self) -> str:
        return str(self._opened["pubkey"])

    @property
    def process_ids(self) -> tuple[int, ...]:
        """The writer process's pid while one runs (covenant's own child, never an agent's)."""
        return (self._writer.process.pid,) if self._writer is not None else ()

    @property
    def recovered(self) -> dict[str, Any] | None:
        """The data of the audit.recover record written when this log was opened, if any."""
        return self._opened.get("recovered")

    # -- the trio side -----------------------------------------------------------

    def _submit(self, items: list[_Pending]) -> None:
        """Send ``items`` to the writer, in one write when they fit (they stay adjacent and in order)."""
        assert self._writer is not None
        if self._settled.is_set():
            self._settled = trio.Event()
        self._in_flight.extend(items)
        self._writer.send_soon(items[0].frame if len(items) == 1 else b"".join(item.frame for item in items))

    def _acknowledge(self, first: int, count: int, fsync_s: float) -> None:
        """The next ``count`` frames in flight are durable, their audit records from seq ``first`` on."""
        in_flight = self._in_flight
        seq = first
        for _ in range(count):
            item = in_flight.popleft()
            if item.event:
                item.seq = seq
                seq += 1
            item.done.set()
        self._settle()
        self._last_write = trio.current_time()
        if self._on_batch is not None and seq > first:
            try:
                self._on_batch(seq - first, fsync_s)
            except Exception:  # a metrics hook must never take the audit log down
                log.exception("audit on_batch hook failed")

    def _fail(self, exc: OSError) -> None:
        """A write or sync failed, or the writer died: refuse everything in flight and from now on."""
        error = unavailable(self._directory, exc)
        self._failure = error.message
        self._failed_at = trio.current_time()
        failed = list(self._in_flight)
        self._in_flight.clear()
        log.error(
            "audit log write failed: refusing further records (fail closed)",
            extra={"directory": str(self._directory), "error": str(exc), "records_lost": len(failed)},
        )
        for item in failed:
            item.error = error
            item.done.set()
        self._refused += len(failed)
        self._settle()

    def _settle(self) -> None:
        if not self._in_flight:
            self._settled.set()

    async def _start_writer(self) -> None:
        self._writer, self._opened = await _WriterProcess.start(self._command, self._hello)
        self._head = self._opened["head"]
        _report_repairs(self._directory, self._opened["recovered"], self._opened["sealed"])

    async def _serve(self, writer: _WriterProcess) -> None:
        """Take the writer's answers until it ends; a writer that ends unasked is a failure."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.flush)
            while messages := await writer.receive():
                for message in messages:
                    if "ack" in message:
                        self._head = message["head"]
                        _report_repairs(self._directory, None, message.get("sealed"))
                        self._acknowledge(*message["ack"])
                    elif "log" in message:
                        logger, level, text, extra = log_call(message["log"])
                        logger.log(level, text, extra={**extra, "writer_pid": writer.process.pid})
                    else:
                        failed = message["failed"]
                        self._fail(OSError(failed["errno"], failed["strerror"]))
            nursery.cancel_scope.cancel()
        if self._failure is None:
            self._fail(OSError(errno.EIO, f"its writer process (pid {writer.process.pid}) ended unexpectedly"))
        await writer.stop(timeout=_CLOSE_TIMEOUT_S)

    async def _run_writers(self) -> None:
        """Serve the writer; after each failure, start a new one with backoff, then accept records again."""
        while True:
            assert self._writer is not None
            await self._serve(self._writer)
            self._writer = None
            delay = _REOPEN_FIRST_S
            while self._writer is None:
                await trio.sleep(delay)
                try:
                    await self._start_writer()
                except (AuditLogError, OSError) as exc:
                    log.warning(
                        "audit log still cannot be written; retrying",
                        extra={"directory": str(self._directory), "error": str(exc), "retry_s": delay},
                    )
                    delay = min(delay * 2, _REOPEN_MAX_S)
            self._resume()

    def _resume(self) -> None:
        """A new writer has the log open again: say so in the log, then accept records."""
        down_ms = int((trio.current_time() - self._failed_at) * 1000)
        resume = canonical_bytes({"error": self._failure or "", "down_ms": down_ms, "refused": self._refused})
        self._failure = None
        self._refused = 0
        log.warning(
            "audit log writable again; accepting records",
            extra={"directory": str(self._directory), "down_ms": down_ms},
        )
        self._submit([_Pending.record(RESUME, resume)])  # ordered before any later record; nobody waits on it

    async def _run_heartbeat(self) -> None:
        """Write a heartbeat record + checkpoint after ``heartbeat_s`` without writes."""
        interval = self._config.heartbeat_s
        while True:
            due = self._last_write + interval
            if not self.healthy:
                due = max(due, trio.current_time() + interval)
            await trio.sleep_until(due)
            if trio.current_time() - self._last_write >= interval and self.healthy:
                item = _Pending.record(HEARTBEAT, b"{}")
                self._submit([item])
                await item.done.wait()

    async def _drain(self) -> None:
        self._closing = True
        with trio.move_on_after(_CLOSE_TIMEOUT_S):
            await self._settled.wait()
