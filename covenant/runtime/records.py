"""Dispatch records on disk: append-only JSON lines, one segment file per day (and size).

Layout under ``$COVENANT_HOME/state/dispatches/``::

    dispatches-20250131-0000.jsonl
    dispatches-20250131-0001.jsonl   (the day's first segment reached segment_bytes)

Each record is one line written with a single ``write`` on an ``O_APPEND``
descriptor and fsynced, so a crash can only leave a torn *last* line. Readers
skip a line that does not parse and report it (log warning and
:attr:`DispatchStore.problems`); a writer that finds a torn tail ends it with
a newline before appending, so one bad line never swallows the next record.
The writing is :class:`~covenant.audit.record_files.RecordFiles`; the
daemon's records are appended by its audit writer process, in the same
durable commit as the dispatch's last audit events.

Reads never load the whole history: :meth:`recent` reads segments backwards
block by block and stops at ``limit``; :meth:`get` searches segments newest
first for the id's exact byte pattern and parses only the matching line.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from covenant.outside_json import scrub
from covenant.runtime.outcome import DispatchRecord
from covenant.audit.record_files import PREFIX, SEGMENT_BYTES, SUFFIX, RecordFiles

__all__ = ["DispatchStore", "SEGMENT_BYTES", "encode_record"]

log = logging.getLogger("covenant.runtime")

_BLOCK = 64 * 1024


def encode_record(record: DispatchRecord) -> bytes:
    """One record as its line in a segment file.

    A lone surrogate that reached the record anyway (text from outside is decoded with them replaced,
    :mod:`covenant.outside_json`) becomes U+FFFD here too: a record is never lost to its encoding.
    """
    data = record.model_dump(mode="json")
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        return json.dumps(scrub(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class DispatchStore:
    """Append-only, crash-safe store of :class:`DispatchRecord` (thread-safe appends).

    ``append`` is blocking (it fsyncs): call it from a worker thread in trio code.
    """

    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self.problems: list[str] = []
        """Unreadable lines met while reading, each naming file and byte offset."""
        self._files = RecordFiles(self.directory, segment_bytes=segment_bytes)

    # -- writing -------------------------------------------------------------------------

    def append(self, record: DispatchRecord) -> None:
        """Write one record durably (fsync) at the end of today's segment."""
        self._files.append(encode_record(record))
        self._files.sync()

    def close(self) -> None:
        self._files.close()

    # -- reading -------------------------------------------------------------------------

    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}"))

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
