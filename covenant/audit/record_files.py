"""The writing half of the dispatch store: appends encoded records to today's segment file.

Kept apart from :mod:`covenant.runtime.records` (which reads records back as
pydantic models) so that the audit writer process, which appends the
daemon's dispatch records in the same durable commit as their audit events,
imports no pydantic. It sits in the audit package, below the runtime, because that
writer process owns the appends.

Layout under ``$COVENANT_HOME/state/dispatches/``: ``dispatches-YYYYMMDD-NNNN.jsonl``,
one segment per day, a new one once a segment would pass ``segment_bytes``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["RecordFiles", "Warn", "log_warning", "SEGMENT_BYTES", "PREFIX", "SUFFIX"]

Warn = Callable[[str, dict[str, Any]], None]
"""Reports a warning: (message, fields). The writer process passes one that sends it to the daemon."""


def log_warning(message: str, fields: dict[str, Any]) -> None:
    """The default :data:`Warn`: a WARNING of ``covenant.runtime`` with ``fields`` as extras."""
    import logging  # here: the audit writer process passes its own Warn and runs without logging (issue 38)

    logging.getLogger("covenant.runtime").warning(message, extra=fields)

SEGMENT_BYTES = 64 * 1024 * 1024
PREFIX = "dispatches-"
SUFFIX = ".jsonl"


class RecordFiles:
    """Appends whole lines with one ``write`` each on an ``O_APPEND`` descriptor (thread-safe).

    A crash can only tear the last line; the next writer ends a torn tail
    with a newline before appending, so one bad line never swallows the next.
    """

    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES, warn: Warn = log_warning) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self._warn = warn
        self._lock = threading.Lock()
        self._fd = -1
        self._fd_path: Path | None = None

    def append(self, line: bytes) -> None:
        """Write one encoded record (ending in a newline); durable only after :meth:`sync`."""
        with self._lock:
            os.write(self._segment_for(len(line)), line)

    def sync(self) -> None:
        """Make every appended line durable (raises OSError when the disk fails)."""
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
            self._fd, self._fd_path = -1, None

    def _segment_for(self, size: int) -> int:
        day = datetime.now(timezone.utc).strftime("%Y%m%d")
        if self._fd >= 0 and self._fd_path is not None and self._fd_path.name.startswith(PREFIX + day):
            if os.fstat(self._fd).st_size + size <= self.segment_bytes:
                return self._fd
        if self._fd >= 0:
            os.fsync(self._fd)  # lines appended since the last sync must not be left behind
            os.close(self._fd)
            self._fd = -1
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        existing = sorted(self.directory.glob(f"{PREFIX}{day}-*{SUFFIX}"))
        index = 0
        if existing:
            last = existing[-1]
            index = int(last.name[len(PREFIX) + 9 : -len(SUFFIX)])
            if last.stat().st_size + size > self.segment_bytes and last.stat().st_size > 0:
                index += 1
        path = self.directory / f"{PREFIX}{day}-{index:04d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._end_torn_line(fd, path)
        self._fd, self._fd_path = fd, path
        return fd

    def _end_torn_line(self, fd: int, path: Path) -> None:
        """If the file's last line was torn by a crash, terminate it so the next record stands alone."""
        size = os.fstat(fd).st_size
        if size == 0:
            return
        with open(path, "rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                self._warn("torn dispatch record at end of file; closing it", {"path": str(path), "offset": size})
                os.write(fd, b"\n")
