"""Audit heads off the host: published to ``COVENANT_AUDIT``, and checked by ``covenant audit verify --fleet``.

A head is what ``covenant audit head --json`` prints (the latest signed
checkpoint: ``log``, ``seq``, ``hash``, ``sig``, …) plus ``host``. The fleet
process publishes one every 10 s when the log has a new checkpoint since the
last head it published (an idle daemon's writer makes one every
``[audit] heartbeat_s``), so the fleet holds a witness at most ~10 s behind the
log. A log later rolled back or rewritten no longer contains those heads:
:func:`check_heads` names the first seq where it disagrees with one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from covenant.audit.format import checkpoint_signature_ok, line_hash
from covenant.fleet.subjects import AUDIT_STREAM, audit_subject

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from nats.js.client import JetStreamContext

__all__ = ["HEAD_INTERVAL_S", "head_message", "fetch_heads", "FleetCheck", "check_heads"]

HEAD_INTERVAL_S = 10.0


def head_message(head: dict[str, Any], host: str) -> bytes:
    """The published body: the head document plus ``host``."""
    return json.dumps({**head, "host": host}, sort_keys=True, separators=(",", ":")).encode()


async def fetch_heads(js: "JetStreamContext", host: str, *, idle_s: float = 2.0) -> list[dict[str, Any]]:
    """Every head published for ``host`` still in COVENANT_AUDIT, oldest first.

    Read through an ordered consumer until it has delivered what was pending when it started.
    """
    import asyncio

    from nats.js.api import DeliverPolicy
    from nats.js.errors import NotFoundError

    subject = audit_subject(host)
    try:
        info = await js.stream_info(AUDIT_STREAM, subjects_filter=subject)
    except NotFoundError:
        return []
    if not (info.state.subjects or {}).get(subject):
        return []
    heads: list[dict[str, Any]] = []
    subscription = await js.subscribe(subject, stream=AUDIT_STREAM, ordered_consumer=True,
                                      deliver_policy=DeliverPolicy.ALL)
    try:
        while True:
            try:
                msg = await subscription.next_msg(timeout=idle_s)
            except asyncio.TimeoutError:
                break
            try:
                document = json.loads(msg.data)
            except ValueError:
                document = None
            if isinstance(document, dict):
                heads.append(document)
            if msg.metadata.num_pending == 0:
                break
    finally:
        await subscription.unsubscribe()
    return heads


@dataclass
class FleetCheck:
    """What the fleet's heads say about one host's log."""

    heads: int = 0
    """Heads of this host with a good signature under the pinned key."""
    ignored: list[str] = field(default_factory=list)
    """Heads not counted (bad signature, not a head): anyone with publish rights in NATS could have sent them."""
    newest_seq: int | None = None
    problem_seq: int | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "heads": self.heads, "newest_seq": self.newest_seq, "ignored": self.ignored,
                "problem": None if self.ok else {"seq": self.problem_seq, "message": self.problem}}


def _line_hashes(audit_dir: Path, seqs: set[int]) -> tuple[dict[int, str], int | None]:
    """The hash of each line whose seq is in ``seqs``, and the last seq of the log."""
    from covenant.audit.reader import Entry, iter_records

    found: dict[int, str] = {}
    last: int | None = None
    for item in iter_records(audit_dir):
        if isinstance(item, Entry):
            last = item.seq
            if item.seq in seqs:
                found[item.seq] = line_hash(item.line)
    return found, last


def check_heads(heads: Iterable[dict[str, Any]], host: str, key: "Ed25519PublicKey", log_id: str | None,
                audit_dir: Path) -> FleetCheck:
    """Compare the log in ``audit_dir`` (id ``log_id``, already verified on its own) with the fleet's heads.

    The first disagreement by seq is reported: a head of another log (the log was started anew),
    a head past the log's end (cut back), a head whose line hashes differently (rewritten).
    """
    check = FleetCheck()
    good: list[dict[str, Any]] = []
    for head in heads:
        seq, hash_hex, head_log = head.get("seq"), head.get("hash"), head.get("log")
        if head.get("host") != host or type(seq) is not int or not isinstance(hash_hex, str) \
                or not isinstance(head_log, str):
            check.ignored.append(f"a message that is not a head of {host}")
            continue
        if not checkpoint_signature_ok(key, head_log, seq, hash_hex, head.get("sig")):
            check.ignored.append(f"head for seq {seq}: its signature does not verify under the pinned key")
            continue
        good.append(head)
    check.heads = len(good)
    if not good:
        return check
    check.newest_seq = max(h["seq"] for h in good)
    hashes, last = _line_hashes(audit_dir, {h["seq"] for h in good if h["log"] == log_id})
    for head in sorted(good, key=lambda h: (h["seq"], h.get("ts") or "")):
        seq = head["seq"]
        if head["log"] != log_id:
            message = (f"the fleet holds a head of log {head['log']} at seq {seq} ({head.get('ts')}), this log is "
                       f"{log_id}: the log was replaced after that head left the host")
        elif seq not in hashes:
            message = (f"the fleet holds a head at seq {seq} ({head.get('ts')}) and the log ends at seq {last}: "
                       "the log was cut back after that head left the host")
        elif hashes[seq] != head["hash"]:
            message = (f"the line of seq {seq} does not hash to the head the fleet holds ({head.get('ts')}): "
                       "the log was rewritten after that head left the host")
        else:
            continue
        check.problem_seq, check.problem = seq, message
        break
    return check
