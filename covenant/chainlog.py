"""Hash-linked JSON lines: an append-only file each record of which holds the hash of the one before.

The session-bridge rule, done deterministically: a file is verified in full
before anything in it is used. Each line is the canonical JSON
(:mod:`covenant.canonical`) of one record with ``seq`` (0, 1, 2 …), ``prev``
(the previous record's ``hash``; 64 zeros for the first) and ``hash`` (the
SHA-256 of the record's canonical JSON without ``hash``). Record 0 is a
header the owner chooses (format, owner id), so a file copied from
elsewhere does not load: either the exact header expected, or a rule
(:data:`RecordCheck`) for headers that vary per file.

Used by the tool host's memory store and by Rune session transcripts (in the
replica: this module imports only the standard library,
:mod:`covenant.canonical` and :mod:`covenant.durable`).

- Bytes after the last newline are a torn tail (a write cut by a crash):
  :func:`read_chain` cuts them from the file (unless asked only to check)
  and reports them.
- Any complete line that does not parse, is not canonical, breaks the
  sequence or the hash link, or a header that differs, is a changed record:
  :class:`ChainCorrupt`, naming the file and line, and nothing is loaded.

What the chain cannot show: whole records removed from the end (no head is
kept elsewhere), or a file rewritten on purpose with every hash recomputed
(the hashes are not keyed: they catch corruption and edits, not a forger with
write access to the daemon's state; the signed audit log is the record that
resists that). Blocking I/O: call from a worker thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from covenant.canonical import canonical_bytes, parse_strict
from covenant.durable import fsync_dir, write_all

__all__ = [
    "ChainCorrupt",
    "TornTail",
    "Chain",
    "read_chain",
    "append_records",
    "rewrite_chain",
    "record_hash",
    "RecordCheck",
    "HeaderRule",
    "GENESIS_PREV",
]

GENESIS_PREV = "0" * 64
_CHAIN_FIELDS = ("seq", "prev", "hash")


class ChainCorrupt(Exception):
    """A record of the file was changed, removed from the middle or reordered; the file is not loaded."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class TornTail:
    """Bytes cut from the end of the file: an unfinished last write."""

    valid_bytes: int
    discarded_bytes: int
    discarded_sha256: str


@dataclass(frozen=True)
class Chain:
    """A verified file: its records (header first), the hash of its last line, and what was cut."""

    records: list[dict[str, Any]]
    last_hash: str
    torn: TornTail | None
    stamp: tuple[int, int, int]
    """(inode, size, mtime ns) after the read: tells whether someone else wrote since."""


def _stamp(fd: int) -> tuple[int, int, int]:
    st = os.fstat(fd)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def record_hash(record: dict[str, Any]) -> str:
    """SHA-256 (hex) of the record's canonical JSON without its ``hash`` field."""
    return hashlib.sha256(canonical_bytes({k: v for k, v in record.items() if k != "hash"})).hexdigest()


RecordCheck = Callable[[dict[str, Any]], str | None]
"""The owner's check of one record (without the chain fields): a problem, or None."""

HeaderRule = dict[str, Any] | RecordCheck
"""Record 0 must be exactly this dict, or pass this check."""


def _payload(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in _CHAIN_FIELDS}


def _header_problem(header: HeaderRule, payload: dict[str, Any]) -> str | None:
    if callable(header):
        return header(payload)
    if payload != header:
        return f"the header is not {canonical_bytes(header).decode()}: this file belongs elsewhere"
    return None


def _verify(
    path: Path, data: bytes, header: HeaderRule, check: RecordCheck | None
) -> tuple[list[dict[str, Any]], str]:
    records: list[dict[str, Any]] = []
    prev = GENESIS_PREV
    for number, line in enumerate(data.split(b"\n")[:-1], start=1):
        try:
            record = parse_strict(line)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ChainCorrupt(path, number, f"not a JSON record ({exc})") from None
        if not isinstance(record, dict):
            raise ChainCorrupt(path, number, "a record must be a JSON object")
        if canonical_bytes(record) != line:
            raise ChainCorrupt(path, number, "the record is not in canonical form: it was edited")
        if record.get("hash") != record_hash(record):
            raise ChainCorrupt(path, number, "the record does not match its hash: it was changed")
        if record.get("seq") != number - 1:
            raise ChainCorrupt(
                path, number, f"seq {record.get('seq')!r} where {number - 1} was expected: records were removed or reordered"
            )
        if record.get("prev") != prev:
            raise ChainCorrupt(path, number, "prev is not the hash of the record before: records were removed or reordered")
        if number == 1:
            problem = _header_problem(header, _payload(record))
        else:
            problem = check(_payload(record)) if check is not None else None
        if problem is not None:
            raise ChainCorrupt(path, number, problem)
        records.append(record)
        prev = record["hash"]
    if not records:
        raise ChainCorrupt(path, 1, "the file has no header record")
    return records, prev


def read_chain(
    path: Path, header: HeaderRule, check: RecordCheck | None = None, *, repair: bool = True
) -> Chain | None:
    """Verify and load ``path``; None when it does not exist. A torn tail is cut from the file first.

    Raises :class:`ChainCorrupt` when a complete record fails verification
    (``check`` is the owner's rule for each record after the header). With
    ``repair=False`` the file is only read: a torn tail is reported, not cut.
    """
    try:
        fd = os.open(path, (os.O_RDWR if repair else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
        end = data.rfind(b"\n") + 1
        torn = None
        if end < len(data):
            tail = data[end:]
            torn = TornTail(end, len(tail), hashlib.sha256(tail).hexdigest())
            data = data[:end]
        records, last = _verify(path, data, header, check)
        if torn is not None and repair:
            os.ftruncate(fd, end)
            os.fsync(fd)
        return Chain(records, last, torn, _stamp(fd))
    finally:
        os.close(fd)


def _sealed(record: dict[str, Any], seq: int, prev: str) -> dict[str, Any]:
    sealed = {**record, "seq": seq, "prev": prev}
    sealed["hash"] = record_hash(sealed)
    return sealed


def append_records(path: Path, chain: Chain | None, header: dict[str, Any], records: Iterable[dict[str, Any]]) -> Chain:
    """Append ``records`` (durably: fdatasync) after ``chain``, creating the file with ``header`` when None.

    ``chain`` must be what :func:`read_chain` or a previous append returned
    for this file; the returned one includes the new records.
    """
    lines: list[bytes] = []
    if chain is None:
        seq, prev, kept = 0, GENESIS_PREV, []
        new = [header, *records]
    else:
        seq, prev, kept = len(chain.records), chain.last_hash, chain.records
        new = list(records)
    done: list[dict[str, Any]] = []
    for record in new:
        sealed = _sealed(record, seq, prev)
        lines.append(canonical_bytes(sealed) + b"\n")
        done.append(sealed)
        prev = sealed["hash"]
        seq += 1
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if chain is None else 0)
    fd = os.open(path, flags, 0o600)
    try:
        write_all(fd, b"".join(lines))
        os.fdatasync(fd)
        stamp = _stamp(fd)
    finally:
        os.close(fd)
    if chain is None:
        fsync_dir(path.parent)
    return Chain([*kept, *done], prev, None, stamp)


def rewrite_chain(path: Path, header: dict[str, Any], records: Iterable[dict[str, Any]]) -> Chain:
    """Replace ``path`` atomically with a fresh chain of ``header`` + ``records`` (compaction)."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        chain = append_records(tmp, None, header, [_payload(r) for r in records])
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    st = os.stat(path)
    return Chain(chain.records, chain.last_hash, None, (st.st_ino, st.st_size, st.st_mtime_ns))
