"""Denied intents, newest first, read back from the audit log.

A denied intent spawns nothing, so it has no dispatch record; the audit log's
``policy.decision`` record with ``allowed: false`` is where it lives.
``covenant history`` merges these with the dispatch records. This is a
reader, not a verifier: an unparsable line is skipped (``covenant audit
verify`` is the proof).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from covenant.audit.format import parse_record, segment_name
from covenant.audit.store import list_segments

__all__ = ["Denial", "recent_denials"]

_DECISION = b'"type":"policy.decision"'
_RECEIVED = b'"type":"intent.received"'


@dataclass
class Denial:
    """One refused intent: when, which intent and agent (None when unrouted), why, and who asked."""

    at: str
    intent_id: str | None
    agent_id: str | None
    reason: str
    message: str | None
    issuer: str | None

    def to_json(self) -> dict[str, Any]:
        """The fields ``covenant history --json`` shows, named like a dispatch record's."""
        return {
            "started_at": self.at,
            "intent_id": self.intent_id,
            "agent_id": self.agent_id,
            "outcome": "denied",
            "reason": self.reason,
            "message": self.message,
            "issuer": self.issuer,
        }


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def recent_denials(directory: Path, limit: int, agent: str | None = None) -> list[Denial]:
    """Up to ``limit`` denials of the log in ``directory``, newest first (only ``agent``'s when given).

    Raises ``PermissionError`` when the log exists but cannot be read.
    """
    found: list[Denial] = []
    awaiting_issuer: dict[str, Denial] = {}  # the intent.received record comes just before the decision
    for index in reversed(list_segments(directory)):
        try:
            data = (directory / segment_name(index)).read_bytes()
        except FileNotFoundError:  # rotated away while we read
            continue
        for line in reversed(data.split(b"\n")):
            if len(found) >= limit and not awaiting_issuer:
                return found
            if _DECISION in line and len(found) < limit:
                record, _ = parse_record(line)
                if record is None or record["data"].get("allowed") is not False:
                    continue
                d = record["data"]
                if agent is not None and d.get("agent") != agent:
                    continue
                denial = Denial(record["ts"], _text(d.get("intent")), _text(d.get("agent")), str(d.get("reason")),
                                _text(d.get("message")), _text(d.get("claimed_issuer")))
                found.append(denial)
                if denial.issuer is None and denial.intent_id is not None:
                    awaiting_issuer[denial.intent_id] = denial
            elif _RECEIVED in line and awaiting_issuer:
                record, _ = parse_record(line)
                if record is None:
                    continue
                waiting = awaiting_issuer.pop(str(record["data"].get("intent")), None)
                if waiting is not None:
                    waiting.issuer = _text(record["data"].get("issuer_display") or record["data"].get("issuer"))
        if len(found) >= limit:
            break  # an issuer still missing is not looked for further back than one segment
    return found
