"""Session transcripts: hash-linked JSON lines, verified before every load.

``<home>/state/sessions/<agent id>/<session id>.jsonl``. Each line is one
record, a JSON object with ``seq`` (0, 1, 2, …), ``prev`` (the previous
record's ``hash``; 64 zeros for the first) and ``hash``: the SHA-256 of the
record's canonical JSON without ``hash`` (sorted keys, no spaces, UTF-8).
Record 0 is ``{"kind": "session", "agent", "session", "issuer", "created_ms"}``;
each later one ``{"kind": "turn", "intent", "messages": [...]}`` with message
text as plain JSON strings.

Verification is deterministic (the session-bridge rule, without a model):
a last line with no newline is a torn append (a crash mid-write): it is cut
and reported. Anything else that does not check out (a changed byte, a
reordered, removed or inserted record) makes the whole session refuse to
load with :class:`SessionCorrupt`: it is never fed to a model.

Stdlib only: the replica imports this.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SESSION_ID_PATTERN",
    "SessionCorrupt",
    "SessionLog",
    "Verified",
    "valid_session_id",
    "session_path",
    "verify_file",
    "record_hash",
]

SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
GENESIS = "0" * 64


class SessionCorrupt(Exception):
    """The session file does not verify; ``message`` names the file, the line and what is wrong."""


def valid_session_id(session_id: str) -> bool:
    """1-128 of ``A-Za-z0-9._-``."""
    return bool(SESSION_ID_PATTERN.fullmatch(session_id))


def session_path(sessions_dir: Path, agent_id: str, session_id: str) -> Path:
    if not valid_session_id(session_id):
        raise ValueError(f"session id {session_id!r}: use 1-128 of A-Za-z0-9._-")
    return sessions_dir / agent_id / f"{session_id}.jsonl"


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def record_hash(record: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``record`` without its ``hash`` field."""
    return hashlib.sha256(_canonical({k: v for k, v in record.items() if k != "hash"})).hexdigest()


@dataclass
class Verified:
    """What a verification found: the records, and how many torn bytes were at the end."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    torn_bytes: int = 0

    @property
    def header(self) -> dict[str, Any]:
        return self.records[0]

    @property
    def turns(self) -> list[dict[str, Any]]:
        return self.records[1:]

    @property
    def head(self) -> str:
        return self.records[-1]["hash"] if self.records else GENESIS


def verify_file(path: Path) -> Verified:
    """Read and check every record; raise SessionCorrupt (FileNotFoundError when absent)."""
    raw = path.read_bytes()
    found = Verified(path)
    end = raw.rfind(b"\n") + 1
    found.torn_bytes = len(raw) - end
    prev = GENESIS
    for number, line in enumerate(raw[:end].split(b"\n")[:-1], start=1):
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise SessionCorrupt(f"{where}: not a JSON record ({exc})") from None
        if not isinstance(record, dict):
            raise SessionCorrupt(f"{where}: a record must be a JSON object")
        if record.get("seq") != number - 1:
            raise SessionCorrupt(f"{where}: seq is {record.get('seq')!r}, expected {number - 1} (records reordered, removed or inserted)")
        if record.get("prev") != prev:
            raise SessionCorrupt(f"{where}: prev does not match the hash of the record before it (a record was changed or reordered)")
        if record.get("hash") != record_hash(record):
            raise SessionCorrupt(f"{where}: the record's content does not match its hash (the record was changed)")
        kind = record.get("kind")
        if (number == 1) != (kind == "session"):
            raise SessionCorrupt(f"{where}: record kind {kind!r} out of place (the first record, and only it, is the session header)")
        if kind == "turn" and not isinstance(record.get("messages"), list):
            raise SessionCorrupt(f"{where}: a turn record needs a messages list")
        prev = record["hash"]
        found.records.append(record)
    if not found.records and found.torn_bytes == 0:
        raise SessionCorrupt(f"{path}: empty session file")
    return found


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SessionLog:
    """One session's file: verified when opened, appended to with fsync.

    :meth:`open` returns the log and the verified records; a torn tail is cut
    (``torn_bytes`` says how much) before anything is appended. :meth:`new`
    is a session whose file is created by its first checkpoint, header and
    turn in one write.
    """

    def __init__(self, path: Path, verified: Verified) -> None:
        self.path = path
        self.verified = verified
        self._next_seq = len(verified.records)
        self._head = verified.head
        self._header: dict[str, Any] | None = None
        """Set while the file does not exist yet: its first write starts with this header."""

    @classmethod
    def open(cls, path: Path) -> "SessionLog":
        """Verify and repair an existing session (SessionCorrupt, FileNotFoundError)."""
        verified = verify_file(path)
        if verified.torn_bytes:
            with open(path, "r+b") as f:
                f.truncate(path.stat().st_size - verified.torn_bytes)
                f.flush()
                os.fsync(f.fileno())
        if not verified.records:
            raise SessionCorrupt(f"{path}: only a torn first record; the session has no header")
        return cls(path, verified)

    @classmethod
    def new(cls, path: Path, *, agent: str, session: str, issuer: str, now_ms: int) -> "SessionLog":
        """A session not on disk yet: its header is written with the first turn (one write, one fsync)."""
        log = cls(path, Verified(path))
        log._header = {"kind": "session", "agent": agent, "session": session, "issuer": issuer, "created_ms": now_ms}
        log.verified.records.append({**log._header, "seq": 0, "prev": GENESIS, "hash": ""})  # completed when written
        return log

    @classmethod
    def create(cls, path: Path, *, agent: str, session: str, issuer: str, now_ms: int) -> "SessionLog":
        """Start a new session file with its header record now (refuses to overwrite one)."""
        log = cls.new(path, agent=agent, session=session, issuer=issuer, now_ms=now_ms)
        log._write([])
        return log

    def append_turn(self, intent: str, messages: list[dict[str, Any]]) -> None:
        self._write([{"kind": "turn", "intent": intent, "messages": messages}])

    def _write(self, payloads: list[dict[str, Any]]) -> None:
        header = self._header
        records = []
        if header is not None:  # the file does not exist yet: it starts with the header
            records.append(self._record(header))
        records += [self._record(p) for p in payloads]
        data = b"".join(_canonical(r) + b"\n" for r in records)
        if header is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if header is not None else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if header is not None:
            _fsync_dir(self.path.parent)
            self._header = None
            self.verified.records.pop(0)
        self.verified.records.extend(records)

    def _record(self, payload: dict[str, Any]) -> dict[str, Any]:
        record = {**payload, "seq": self._next_seq, "prev": self._head}
        record["hash"] = record_hash(record)
        self._next_seq += 1
        self._head = record["hash"]
        return record
