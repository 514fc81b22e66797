"""Dispatch records on disk: append-only JSON lines, one segment file per day (and size).

Layout under ``$COVENANT_HOME/state/dispatches/``::

    dispatches-20250131-0000.jsonl
    dispatches-20250131-0001.jsonl   (the day's first segment reached segment_bytes)

Each record is one line written with a single ``write`` on an ``O_APPEND``
descriptor and fsynced, so a crash can only leave a torn *last* line. Readers
skip a line that does not parse and report it (log warning and
:attr:`DispatchStore.problems`); a writer that finds a torn tail ends it with
a newline before appending, so one bad line never swallows the next record.

Reads never load the whole history: :meth:`recent` reads segments backwards
block by block and stops at ``limit``; :meth:`get` searches segments newest
first for the id's exact byte pattern and parses only the matching line.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from covenant.runtime.outcome import DispatchRecord

__all__ = ["DispatchStore", "SEGMENT_BYTES"]

log = logging.getLogger("covenant.runtime")

SEGMENT_BYTES = 64 * 1024 * 1024
_PREFIX = "dispatches-"
_SUFFIX = ".jsonl"
_BLOCK = 64 * 1024


def _encode(record: DispatchRecord) -> bytes:
    data = record.model_dump(mode="json")
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class DispatchStore:
    """Append-only, crash-safe store of :class:`DispatchRecord` (thread-safe appends).

    ``append`` is blocking (it fsyncs): call it from a worker thread in trio code.
    """

    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.problems: list[str] = []
        """Unreadable lines met while reading, each naming file and byte offset."""
        self._lock = threading.Lock()
        self._fd = -1
        self._fd_path: Path | None = None

    # -- writing -------------------------------------------------------------------------

    def append(self, record: DispatchRecord) -> None:
        """Write one record durably (fsync) at the end of today's segment."""
        line = _encode(record)
        with self._lock:
            fd = self._segment_for(len(line))
            os.write(fd, line)
            os.fsync(fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
            self._fd, self._fd_path = -1, None

    def _segment_for(self, size: int) -> int:
        day = datetime.now(timezone.utc).strftime("%Y%m%d")
        if self._fd >= 0 and self._fd_path is not None and self._fd_path.name.startswith(_PREFIX + day):
            if os.fstat(self._fd).st_size + size <= self.segment_bytes:
                return self._fd
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        existing = sorted(self.directory.glob(f"{_PREFIX}{day}-*{_SUFFIX}"))
        index = 0
        if existing:
            last = existing[-1]
            index = int(last.name[len(_PREFIX) + 9 : -len(_SUFFIX)])
            if last.stat().st_size + size > self.segment_bytes and last.stat().st_size > 0:
                index += 1
        path = self.directory / f"{_PREFIX}{day}-{index:04d}{_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._end_torn_line(fd, path)
        self._fd, self._fd_path = fd, path
        return fd

    @staticmethod
    def _end_torn_line(fd: int, path: Path) -> None:
        """If the file's last line was torn by a crash, terminate it so the next record stands alone."""
        size = os.fstat(fd).st_size
        if size == 0:
            return
        with open(path, "rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                log.warning("torn dispatch record at end of file; closing it", extra={"path": str(path), "offset": size})
                os.write(fd, b"\n")

    # -- reading -------------------------------------------------------------------------

    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob(f"{_PREFIX}*{_SUFFIX}"))

    def recent(self, limit: int, agent: str | None = None, *, peer_uid: int | None = None) -> list[DispatchRecord]:
        """Up to ``limit`` records, newest first, optionally only those of agent ``agent``.

        With ``peer_uid``, only the records that uid submitted (per-user visibility).
        """
        return list(itertools.islice(self.newest_first(agent, peer_uid=peer_uid), max(limit, 0)))

    def newest_first(self, agent: str | None = None, *, peer_uid: int | None = None) -> Iterator[DispatchRecord]:
        """Every record, newest first, read lazily (optionally only agent ``agent``'s, or ``peer_uid``'s)."""
        for path in reversed(self.segments()):
            for offset, line in _reverse_lines(path):
                record = self._parse(path, offset, line)
                if record is None or (agent is not None and record.agent_id != agent):
                    continue
                if peer_uid is None or record.peer_uid == peer_uid:
                    yield record

    def get(self, intent_id: str) -> DispatchRecord | None:
        """The newest record for ``intent_id``, or None."""
        needle = b'"intent_id":' + json.dumps(intent_id, ensure_ascii=False).encode()
        for path in reversed(self.segments()):
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            at = data.rfind(needle)
            while at >= 0:
                start = data.rfind(b"\n", 0, at) + 1
                end = data.find(b"\n", at)
                end = len(data) if end < 0 else end
                record = self._parse(path, start, data[start:end])
                if record is not None and record.intent_id == intent_id:
                    return record
                at = data.rfind(needle, 0, start)
        return None

    def _parse(self, path: Path, offset: int, line: bytes) -> DispatchRecord | None:
        if not line.strip():
            return None
        try:
            return DispatchRecord.model_validate_json(line)
        except ValidationError as exc:
            problem = f"{path}: byte {offset}: unreadable dispatch record ({exc.error_count()} errors), skipped"
            if problem not in self.problems:
                self.problems.append(problem)
                log.warning("unreadable dispatch record", extra={"path": str(path), "offset": offset})
            return None


def _reverse_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(offset, line) from the end of the file backwards, reading 64 KiB blocks."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        position = f.seek(0, os.SEEK_END)
        rest = b""
        while position > 0:
            step = min(_BLOCK, position)
            position -= step
            f.seek(position)
            chunk = f.read(step) + rest
            lines = chunk.split(b"\n")
            rest = lines.pop(0)
            offset = position + len(rest) + 1
            found = []
            for line in lines:
                found.append((offset, line))
                offset += len(line) + 1
            yield from reversed(found)
        if rest:
            yield 0, rest
