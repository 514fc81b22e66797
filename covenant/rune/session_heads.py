"""Session heads: the last record of each session, signed by the daemon, so a rolled-back file is caught.

A session file's hash chain proves each record follows the one before it, not that the file still ends
where it ended: a file cut back to an earlier record (``sed -i '$d'``, a backup put back) is itself a valid
chain. So every append also records the session's head, ``<session id>.head`` beside the file:

    {"agent": …, "hash": "<hash of the last record>", "seq": <its seq>, "session": …, "sig": "<Ed25519 hex>"}

``sig`` is the daemon key's signature of ``covenant-session-head/v1\\n<agent>\\n<session>\\n<seq>\\n<hash>\\n``.
Before a session is loaded its file must reach the head: a last record below ``seq`` is ``truncated``; a
record at ``seq`` whose hash differs is ``edited``; a head that does not verify is ``head``. Each is a
corrupt session: it is never fed to a model.

Why a file of its own and not the audit log: the head is checked at every load of a session, however old,
in one read and one signature check; finding it in the audit log would mean reading the log back to the
session's last use (it may be months and gigabytes back) or keeping an index, which is one more file to
trust. Why signed: whoever could rewrite the session could rewrite an unsigned head as easily; the daemon's
key (0600, in ``identity/``) is what they would need as well, as for the audit log. The head is written
after the append is durable, and synced before it is renamed into place: after a crash it is the old head
or the new one, never ahead of the file (a file longer than its head loads).

What this cannot catch: a session file removed together with its head (it is then a new session), or both
put back from the same old copy. The audit log's ``intent.completed`` of each Rune intent names its
``session``.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from covenant.canonical import canonical_bytes
from covenant.keys import verify_signature

__all__ = ["HEAD_SUFFIX", "SessionHead", "HeadProblem", "head_path", "write_head", "read_head", "check_head"]

HEAD_SUFFIX = ".head"
_FORMAT = "covenant-session-head/v1"
_MAX_BYTES = 4096


class SessionHead(NamedTuple):
    """The last record of a session when a turn was last appended."""

    seq: int
    hash: str


class HeadProblem(Exception):
    """The session does not reach, or does not match, its signed head. ``reason``: ``truncated``, ``edited``
    or ``head`` (the head itself does not verify)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def head_path(session_file: Path) -> Path:
    """``<session id>.head`` beside ``<session id>.jsonl``."""
    return session_file.with_suffix(HEAD_SUFFIX)


def _message(agent: str, session: str, seq: int, hash_: str) -> bytes:
    return f"{_FORMAT}\n{agent}\n{session}\n{seq}\n{hash_}\n".encode()


def write_head(session_file: Path, agent: str, session: str, head: SessionHead, key: Ed25519PrivateKey) -> None:
    """Record ``head`` for the session, atomically (blocking): a temp file, synced, renamed over the old head.

    Call after the append it describes is durable.
    """
    document = {"agent": agent, "session": session, "seq": head.seq, "hash": head.hash,
                "sig": key.sign(_message(agent, session, head.seq, head.hash)).hex()}
    target = head_path(session_file)
    tmp = target.with_name(target.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, canonical_bytes(document) + b"\n")
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)


def read_head(session_file: Path, agent: str, session: str, public_key: Ed25519PublicKey | None) -> SessionHead | None:
    """The session's recorded head, None when it has none (a session from before heads were kept, or new).

    Raises :class:`HeadProblem` (reason ``head``) when the head file is unreadable, names another session, or
    its signature does not verify under ``public_key`` (with None the signature is not checked: a reader
    without the daemon's key still compares the file with the head).
    """
    path = head_path(session_file)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HeadProblem("head", f"{path}: cannot read the session's head ({exc.strerror})") from None
    try:
        raw = os.read(fd, _MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        document: Any = json.loads(raw) if len(raw) <= _MAX_BYTES else None
    except ValueError:
        document = None
    if not (isinstance(document, dict) and document.get("agent") == agent and document.get("session") == session
            and type(document.get("seq")) is int and isinstance(document.get("hash"), str)
            and isinstance(document.get("sig"), str)):
        raise HeadProblem("head", f"{path}: the session's head is not a head of this session")
    head = SessionHead(document["seq"], document["hash"])
    if public_key is not None:
        try:
            signature = bytes.fromhex(document["sig"])
        except ValueError:
            signature = b""
        if not verify_signature(public_key, signature, _message(agent, session, head.seq, head.hash)):
            raise HeadProblem("head", f"{path}: the session's head is not signed by this daemon's key")
    return head


def check_head(session_file: Path, records: list[dict[str, Any]], head: SessionHead | None) -> None:
    """Does the verified chain ``records`` reach ``head``? Raise :class:`HeadProblem` when it does not."""
    if head is None:
        return
    last = len(records) - 1
    if last < head.seq:
        ends = f"ends at record {last}" if records else "is gone"
        raise HeadProblem("truncated", f"{session_file}: the file {ends}, but its head says record {head.seq} "
                                       f"was appended: records were removed from its end (rolled back)")
    if records[head.seq].get("hash") != head.hash:
        raise HeadProblem("edited", f"{session_file}:{head.seq + 1}: record {head.seq} is not the one its head "
                                    f"recorded: the file was replaced with another history")
