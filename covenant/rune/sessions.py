"""Session transcripts: hash-linked JSON lines, verified before every load.

``<home>/state/sessions/<agent id>/<session id>.jsonl``, in the format of
:mod:`covenant.chainlog`: each line is the canonical JSON of one record with
``seq`` (0, 1, 2, …), ``prev`` (the previous record's ``hash``; 64 zeros for
the first) and ``hash``: the SHA-256 of the record's canonical JSON without
``hash`` (sorted keys, no spaces, UTF-8). Record 0 is ``{"kind": "session",
"agent", "session", "issuer", "created_ms"}``; each later one ``{"kind":
"turn", "intent", "messages": [...]}`` with message text as plain JSON strings.

Verification is deterministic (the session-bridge rule, without a model):
a last line with no newline is a torn append (a crash mid-write): it is cut
and reported. Anything else that does not check out (a changed byte, a line
not in canonical form, a reordered, removed or inserted record) makes the
whole session refuse to load with :class:`SessionCorrupt`: it is never fed
to a model.

Standard library and :mod:`covenant.chainlog` only: the replica imports this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from covenant.clock import now_ms as _now_ms
from covenant.chainlog import GENESIS_PREV, Chain, ChainCorrupt, append_records, read_chain, record_hash

__all__ = [
    "SESSION_ID_PATTERN",
    "SessionCorrupt",
    "SessionRefused",
    "open_session",
    "SessionLog",
    "Verified",
    "valid_session_id",
    "session_path",
    "verify_file",
    "record_hash",
]

SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class SessionCorrupt(Exception):
    """The session file does not verify; ``message`` names the file, the line and what is wrong."""


class SessionRefused(Exception):
    """An intent may not use the session: ``code`` is its outcome (``session_corrupt``, ``session_forbidden``);
    for a corrupt one ``reason`` says how: ``edited`` (a record changed, removed from the middle, reordered or
    inserted), ``truncated`` or ``head`` (:mod:`covenant.rune.session_heads`)."""

    def __init__(self, code: str, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


def valid_session_id(session_id: str) -> bool:
    """1-128 of ``A-Za-z0-9._-``."""
    return bool(SESSION_ID_PATTERN.fullmatch(session_id))


def session_path(sessions_dir: Path, agent_id: str, session_id: str) -> Path:
    if not valid_session_id(session_id):
        raise ValueError(f"session id {session_id!r}: use 1-128 of A-Za-z0-9._-")
    return sessions_dir / agent_id / f"{session_id}.jsonl"


_OUT_OF_PLACE = "record kind {!r} out of place (the first record, and only it, is the session header)"


def _check_header(payload: dict[str, Any]) -> str | None:
    kind = payload.get("kind")
    return None if kind == "session" else _OUT_OF_PLACE.format(kind)


def _check_turn(payload: dict[str, Any]) -> str | None:
    kind = payload.get("kind")
    if kind == "session":
        return _OUT_OF_PLACE.format(kind)
    if kind == "turn" and not isinstance(payload.get("messages"), list):
        return "a turn record needs a messages list"
    return None


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
        return self.records[-1]["hash"] if self.records else GENESIS_PREV


def _load(path: Path, *, repair: bool) -> Chain:
    try:
        chain = read_chain(path, _check_header, _check_turn, repair=repair)
    except ChainCorrupt as exc:
        raise SessionCorrupt(str(exc)) from None
    if chain is None:
        raise FileNotFoundError(2, "No such file or directory", str(path))
    return chain


def _verified(path: Path, chain: Chain) -> Verified:
    return Verified(path, list(chain.records), chain.torn.discarded_bytes if chain.torn else 0)


def verify_file(path: Path) -> Verified:
    """Read and check every record, leaving the file as it is; raise SessionCorrupt (FileNotFoundError when absent)."""
    return _verified(path, _load(path, repair=False))


class SessionLog:
    """One session's file: verified when opened, appended to durably.

    :meth:`open` returns the log and the verified records; a torn tail is cut
    (``torn_bytes`` says how much) before anything is appended. :meth:`new`
    is a session whose file is created by its first checkpoint, header and
    turn in one write.
    """

    def __init__(self, path: Path, verified: Verified, chain: Chain | None) -> None:
        self.path = path
        self.verified = verified
        self._chain = chain
        """None while the file does not exist yet: its first write starts with the header."""

    @property
    def on_disk(self) -> bool:
        """Does the session's file exist (it was opened, or written since)?"""
        return self._chain is not None

    @classmethod
    def open(cls, path: Path) -> "SessionLog":
        """Verify and repair an existing session (SessionCorrupt, FileNotFoundError)."""
        chain = _load(path, repair=True)
        return cls(path, _verified(path, chain), chain)

    @classmethod
    def new(cls, path: Path, *, agent: str, session: str, issuer: str, now_ms: int) -> "SessionLog":
        """A session not on disk yet: its header is written with the first turn (one write, one sync)."""
        header = {"kind": "session", "agent": agent, "session": session, "issuer": issuer, "created_ms": now_ms}
        log = cls(path, Verified(path), None)
        log.verified.records.append({**header, "seq": 0, "prev": GENESIS_PREV, "hash": ""})  # completed when written
        return log

    @classmethod
    def create(cls, path: Path, *, agent: str, session: str, issuer: str, now_ms: int) -> "SessionLog":
        """Start a new session file with its header record now (refuses to overwrite one)."""
        log = cls.new(path, agent=agent, session=session, issuer=issuer, now_ms=now_ms)
        log._write([])
        return log

    def append_turn(self, intent: str, messages: list[dict[str, Any]], at_ms: int | None = None) -> None:
        """One turn, stamped with when it was written (``at_ms``: a later load gives each turn its age)."""
        self._write([{"kind": "turn", "intent": intent, "messages": messages,
                      "at_ms": at_ms if at_ms is not None else _now_ms()}])

    def _write(self, payloads: list[dict[str, Any]]) -> None:
        if self._chain is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            header = {k: v for k, v in self.verified.header.items() if k not in ("seq", "prev", "hash")}
            self._chain = append_records(self.path, None, header, payloads)
        else:
            self._chain = append_records(self.path, self._chain, {}, payloads)
        self.verified.records[:] = self._chain.records


def open_session(sessions_dir: Path, agent_id: str, session_id: str, issuer: str, now_ms: int) -> SessionLog:
    """The session for an intent of ``issuer``: verified (a torn tail cut), or new; raise :class:`SessionRefused`.

    A session is its starter's: another issuer's intent gets ``session_forbidden``.
    """
    path = session_path(sessions_dir, agent_id, session_id)
    try:
        log = SessionLog.open(path)
    except FileNotFoundError:
        return SessionLog.new(path, agent=agent_id, session=session_id, issuer=issuer, now_ms=now_ms)
    except SessionCorrupt as exc:
        raise SessionRefused("session_corrupt", f"session {session_id} refused (edited): {exc}", "edited") from None
    except OSError as exc:
        raise SessionRefused("session_corrupt", f"session {session_id}: cannot read {path}: {exc.strerror or exc}",
                             "unreadable") from None
    if log.verified.header.get("issuer") != issuer:
        raise SessionRefused("session_forbidden", f"session {session_id} was started by another issuer; start a new session")
    return log
