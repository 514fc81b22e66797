"""The audit writer process: owns the log files, group-commits what the daemon sends.

The daemon's event loop and this process talk over one unix socketpair
(:mod:`covenant.audit.channel` has the framing). Encoding the lines, hashing
the chain, signing checkpoints, writing and ``fdatasync`` happen here, on the
second core, instead of in a thread that competes for the daemon's GIL.

The protocol, in order:

1. The daemon sends one frame: a JSON hello with the protocol version
   (:data:`~covenant.audit.channel.PROTOCOL`), the directory, the segment
   size, the batch limits, the private key (hex) and the dispatch records'
   directory (or null). The key travels over the
   socketpair only, never in argv or the environment.
2. This process locks and opens (or recovers) the log and answers
   ``{"opened": {...}}`` or ``{"error": {...}}`` (then exits 1).
3. Each further frame is one record: an audit record (type, timestamp,
   canonical data) or a dispatch record (its line). This process takes
   everything queued, up to ``batch_max``, appends the dispatch records to
   their segment file and the audit records with one checkpoint to the log,
   syncs both, and answers ``{"ack": [first seq, count, fsync s], "head":
   {...}}`` (``count`` frames, the audit records among them numbered from
   ``first``). A failed write or sync answers ``{"failed": {...}}`` and
   ends the process: the daemon starts a new one, which reopens the log from
   disk (a failed descriptor is never trusted again).
4. End of file from the daemon: the rest is written, head.json last, and the
   process exits 0.

What this process has to report once the log is open (a torn dispatch-record line it ends after a
crash) goes to the daemon as a ``{"log": {...}}`` line; the daemon writes it to its own log, in its
format, with ``writer_pid``. This process imports no ``logging`` (nor dataclasses, tempfile or
secrets: tests/audit/test_writer_imports.py): its modules report through a ``warn`` callable, and
every module it does not load is RSS it does not hold beside the daemon (issue 38).

It dies with the daemon (PR_SET_PDEATHSIG): what it had not acknowledged was
never promised, and a torn tail is cut on the next open.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import select
import signal
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.channel import DISPATCH, PROTOCOL, FrameReader, log_message
from covenant.audit.errors import AuditLogError
from covenant.audit.store import Item, LogFiles
from covenant.audit.record_files import RecordFiles, Warn

__all__ = ["main", "serve"]

# Longest head.json may lag behind the newest checkpoint while the log is open.
HEAD_INTERVAL_S = 0.5
# How long a new writer waits for the lock of one that is still dying (its daemon was killed).
LOCK_WAIT_S = 2.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the daemon dies; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")


def _warn_daemon(sock: socket.socket) -> Warn:
    """A ``warn`` for this process's modules: the daemon logs it as a WARNING of ``covenant.runtime``."""

    def warn(message: str, fields: dict[str, Any]) -> None:
        try:
            _send(sock, {"log": log_message("WARNING", "covenant.runtime", message, fields)})
        except OSError:  # the daemon is gone
            pass

    return warn


# What the queue holds: an audit record, or a dispatch record's line.
_Entry = Item | bytes


class _Writer:
    def __init__(
        self, sock: socket.socket, files: LogFiles, dispatches: RecordFiles | None, batch_max: int, batch_wait_s: float
    ) -> None:
        self._sock = sock
        self._files = files
        self._dispatches = dispatches
        self._batch_max = batch_max
        self._linger = batch_wait_s
        self._frames = FrameReader()
        self._queue: deque[_Entry] = deque()
        self._eof = False

    def _receive(self, block: bool) -> None:
        """Read what the daemon has sent (waiting for it when ``block``) into the queue."""
        flags = 0 if block else socket.MSG_DONTWAIT
        while not self._eof:
            try:
                chunk = self._sock.recv(1 << 20, flags)
            except BlockingIOError:
                return
            if not chunk:
                self._eof = True
                return
            for frame in self._frames.feed(chunk):
                if frame[:1] == DISPATCH:
                    self._queue.append(frame[1:])
                else:
                    kind, ts, data = frame[1:].split(b"\x00", 2)
                    self._queue.append((kind.decode(), data, ts.decode()))
            flags = socket.MSG_DONTWAIT

    def _take_batch(self) -> list[_Entry]:
        self._receive(block=False)
        if self._linger and len(self._queue) < self._batch_max:
            time.sleep(self._linger)
            self._receive(block=False)
        return [self._queue.popleft() for _ in range(min(self._batch_max, len(self._queue)))]

    def run(self) -> int:
        """Append batches until end of file; keep head.json at most HEAD_INTERVAL_S behind."""
        head_dirty, last_head = False, time.monotonic()
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        try:
            while True:
                if not self._queue and not self._eof:
                    timeout = None
                    if head_dirty:
                        timeout = max(0, int((last_head + HEAD_INTERVAL_S - time.monotonic()) * 1000))
                    if poller.poll(timeout):
                        self._receive(block=True)
                if not self._queue and self._eof:
                    break
                if batch := self._take_batch():
                    first, fsync_s = self._commit(batch)
                    message: dict[str, Any] = {"ack": [first, len(batch), fsync_s], "head": self._files.head}
                    if self._files.sealed is not None:
                        message["sealed"], self._files.sealed = self._files.sealed, None
                    _send(self._sock, message)
                    head_dirty = True
                if head_dirty and time.monotonic() - last_head >= HEAD_INTERVAL_S:
                    self._files.write_head()
                    head_dirty, last_head = False, time.monotonic()
            if head_dirty:
                self._files.write_head()
        except OSError as exc:  # the log or head.json: nothing more is acknowledged by this process
            _send(self._sock, {"failed": {"errno": exc.errno or 0, "strerror": exc.strerror or str(exc)}})
            return 1
        finally:
            self._files.close()
            if self._dispatches is not None:
                self._dispatches.close()
        return 0

    def _commit(self, batch: list[_Entry]) -> tuple[int, float]:
        """Make ``batch`` durable: the dispatch records' lines, the audit records and their checkpoint.

        The two syncs run one after the other: side by side (the lines' on a thread) they saved
        0.035 ms of the round trip and cost 3 % more CPU per dispatch (docs/performance.md).
        Returns (first seq, seconds the log's sync took).
        """
        lines = [entry for entry in batch if isinstance(entry, bytes)]
        events = [entry for entry in batch if not isinstance(entry, bytes)]
        if not lines:
            return self._files.append(events)
        if self._dispatches is None:
            raise OSError(errno.EINVAL, "a dispatch record came, but no dispatch directory was given")
        for line in lines:
            self._dispatches.append(line)
        if not events:
            self._dispatches.sync()
            return self._files.state.next_seq, 0.0
        first, fsync_s = self._files.append(events)
        self._dispatches.sync()
        return first, fsync_s


def _open_files(hello: dict[str, Any], fsync: Callable[[int], None]) -> LogFiles:
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(hello["key"]))
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return LogFiles.open(Path(hello["directory"]), key, hello["segment_bytes"], fsync)
        except AuditLogError as exc:
            if not exc.details.get("locked") or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def serve(sock: socket.socket, fsync: Callable[[int], None] = os.fdatasync) -> int:
    """Run the writer on ``sock`` (blocking); returns the exit status."""
    frames = FrameReader()
    hello: dict[str, Any] | None = None
    while hello is None:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return 1
        for frame in frames.feed(chunk):
            hello = json.loads(frame)
    if hello.get("protocol") != PROTOCOL:
        message = (
            f"the audit writer on disk speaks protocol {PROTOCOL}, the daemon {hello.get('protocol')}: "
            f"covenant was upgraded under a running daemon; restart the daemon"
        )
        _send(sock, {"error": {"kind": "log", "message": message}})
        return 1
    try:
        files = _open_files(hello, fsync)
    except AuditLogError as exc:
        _send(sock, {"error": {"kind": "log", "message": exc.message}})
        return 1
    except OSError as exc:
        _send(sock, {"error": {"kind": "os", "errno": exc.errno or 0, "strerror": exc.strerror or str(exc)}})
        return 1
    # Its first append comes after "opened" below: the daemon's start-up reads that answer first.
    dispatches = RecordFiles(Path(hello["dispatches"]), warn=_warn_daemon(sock)) if hello.get("dispatches") else None
    writer = _Writer(sock, files, dispatches, hello["batch_max"], hello["batch_wait_ms"] / 1000)
    opened = {"pubkey": files.pubkey_hex, "recovered": files.recovered, "sealed": files.sealed, "head": files.head}
    files.sealed = None
    _send(sock, {"opened": opened})
    return writer.run()


def main(fsync: Callable[[int], None] = os.fdatasync) -> int:
    """``python -m covenant.audit.writer_process FD PARENT_PID`` (started by :class:`AuditLog`)."""
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    _die_with_parent(parent)
    # A terminal's ^C and systemd's SIGTERM to the whole unit are the daemon's to handle: it still
    # writes daemon.stop through this process, then closes the socket.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    try:
        return serve(sock, fsync)
    except BrokenPipeError:  # the daemon is gone; what was not acknowledged was never promised
        return 1


if __name__ == "__main__":
    sys.exit(main())
