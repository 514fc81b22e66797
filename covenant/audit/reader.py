"""Read the audit log in order, and follow it live (``covenant audit tail -f``).

The reader needs no lock and no daemon: it reads the segment files as they
are. While following it checks ``seq`` and ``prev`` links as lines arrive,
switches to the next segment when one appears, and reports (as Notice items)
anything an operator must see: a file that shrank or was replaced, a broken
link, an unparseable line, a recovery.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from covenant.audit.format import CHECKPOINT, RECOVER, line_hash, parse_record, segment_name
from covenant.audit.store import list_segments

__all__ = ["Entry", "Notice", "CaughtUp", "iter_records", "follow"]


@dataclass(frozen=True)
class Entry:
    """One record as read from disk."""

    segment: str
    offset: int
    record: dict[str, Any]
    line: bytes

    @property
    def seq(self) -> int:
        return self.record["seq"]

    @property
    def type(self) -> str:
        return self.record["type"]


@dataclass(frozen=True)
class Notice:
    """Something the reader wants an operator to see; ``loud`` ones mean possible tampering."""

    message: str
    loud: bool = True


@dataclass(frozen=True)
class CaughtUp:
    """Yielded once by ``follow`` when it first reaches the end of the log (the backlog is done)."""


def iter_records(directory: Path) -> Iterator[Entry | Notice]:
    """Every record of the log once, in order, with notices for anything odd."""
    for item in follow(directory, keep_following=False):
        if not isinstance(item, CaughtUp):
            yield item


def follow(
    directory: Path,
    *,
    keep_following: bool = True,
    poll_s: float = 0.2,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[Entry | Notice | CaughtUp]:
    """Yield records from the start of the log, then (``keep_following``) new ones as they arrive."""
    return _Follower(Path(directory), poll_s).run(keep_following, should_stop or (lambda: False))


class _Follower:
    def __init__(self, directory: Path, poll_s: float) -> None:
        self.directory = directory
        self.poll_s = poll_s
        self.index = 0
        self.file: BinaryIO | None = None
        self.inode = -1
        self.pos = 0  # bytes consumed from the current file (complete lines only)
        self.buf = b""
        self.next_seq: int | None = None
        self.prev: str | None = None
        self.last_seen: tuple[int, str] | None = None  # (seq, hash) of the last record yielded
        self.committed: tuple[int, str] | None = None  # (next seq, hash) after the last checkpoint
        self.resync = False  # re-reading a replaced/shrunk file: skip what was already shown
        self.caught_up = False

    @property
    def path(self) -> Path:
        return self.directory / segment_name(self.index)

    def _open(self) -> bool:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return False
        self.file, self.inode, self.pos, self.buf = f, os.fstat(f.fileno()).st_ino, 0, b""
        return True

    def _close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def run(self, keep_following: bool, should_stop: Callable[[], bool]) -> Iterator[Entry | Notice | CaughtUp]:
        indexes = list_segments(self.directory)
        if indexes and indexes[0] != 0:
            yield Notice(f"{self.directory}: {segment_name(0)} is missing; reading from {segment_name(indexes[0])}")
            self.index = indexes[0]
        try:
            while not should_stop():
                if self.file is None and not self._open():
                    if not keep_following:
                        return
                    if not self.caught_up:
                        self.caught_up = True
                        yield CaughtUp()
                    time.sleep(self.poll_s)
                    continue
                assert self.file is not None
                chunk = self.file.read(1 << 20)
                if chunk:
                    yield from self._lines(chunk)
                    continue
                yield from self._at_end(keep_following)
                if self.file is None and not keep_following and not self.path.exists():
                    return
                if not keep_following and self.file is not None:
                    return
        finally:
            self._close()

    def _at_end(self, keep_following: bool) -> Iterator[Notice | Entry | CaughtUp]:
        """EOF on the current file: roll to the next segment, detect shrink/replace, or wait."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        size_read = self.pos + len(self.buf)
        if st is None or st.st_ino != self.inode:
            yield Notice(f"{self.path} was {'removed' if st is None else 'replaced'} while being read: re-reading it")
            self._reopen()
            return
        if st.st_size < size_read:
            yield Notice(f"{self.path} shrank from {size_read} to {st.st_size} bytes: the log was cut; re-reading it")
            self._reopen()
            return
        if (self.directory / segment_name(self.index + 1)).exists():
            # The writer never appends to a segment once the next exists:
            # one more read catches anything written just before the roll.
            assert self.file is not None
            rest = self.file.read()
            if rest:
                yield from self._lines(rest)
            if self.buf:
                yield Notice(f"{self.path} ends with an unterminated line of {len(self.buf)} bytes")
            self._close()
            self.index += 1
            return
        if not keep_following:
            if self.buf:
                yield Notice(f"{self.path} ends with an unterminated line of {len(self.buf)} bytes (a write in progress or a torn tail)", loud=False)
            return
        if not self.caught_up:
            self.caught_up = True
            yield CaughtUp()
        time.sleep(self.poll_s)

    def _reopen(self) -> None:
        self._close()
        self.resync = True
        self.next_seq = self.prev = None

    def _lines(self, chunk: bytes) -> Iterator[Entry | Notice]:
        data = self.buf + chunk
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            yield from self._line(data[start:nl], self.pos)
            self.pos += nl + 1 - start
            start = nl + 1
        self.buf = data[start:]

    def _line(self, line: bytes, offset: int) -> list[Entry | Notice]:
        where = f"{segment_name(self.index)} byte {offset}"
        rec, why = parse_record(line)
        if rec is None:
            self.next_seq = self.prev = None
            return [Notice(f"{where}: unreadable line: {why}")]
        h = line_hash(line)
        seq = rec["seq"]
        if self.resync and self.last_seen is not None:
            if seq < self.last_seen[0]:
                return []
            if seq == self.last_seen[0]:
                self.resync = False
                self.next_seq, self.prev = seq + 1, h
                if h != self.last_seen[1]:
                    return [Notice(f"{where}: seq {seq} differs from the line shown before: history was rewritten")]
                return []
            self.resync = False
        out: list[Entry | Notice] = []
        if self.next_seq is not None and (seq != self.next_seq or rec["prev"] != self.prev):
            if rec["type"] == RECOVER and self.committed == (seq, rec["prev"]):
                out.append(Notice(
                    f"{where}: audit.recover: records after seq {seq - 1} shown above were never committed "
                    f"(torn write discarded: {rec['data'].get('discarded_bytes')} bytes)",
                    loud=False,
                ))
            else:
                out.append(Notice(
                    f"{where}: chain broken: expected seq {self.next_seq} linked to the line before, "
                    f"found seq {seq}{' with a different prev' if seq == self.next_seq else ''}"
                ))
        self.next_seq, self.prev = seq + 1, h
        self.last_seen = (seq, h)
        if rec["type"] == CHECKPOINT:
            self.committed = (seq + 1, h)
        out.append(Entry(segment_name(self.index), offset, rec, line))
        return out
