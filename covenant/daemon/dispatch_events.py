"""What a dispatch writes and answers: its audit events and its outcome document.

Pure functions of the intent, the agent, the decision and the record, no I/O: the dispatch path
(:mod:`covenant.daemon.service`) decides when each is written, and in which group commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from covenant.audit.events import text_digest
from covenant.errors import CovenantError
from covenant.manifest.model import AgentSpec
from covenant.policy.intents import Intent
from covenant.runtime.outcome import DispatchRecord, outcome_exit_code
from covenant.workflow import ChainLink, ChildCall

__all__ = [
    "Event",
    "ChildOrigin",
    "received_event",
    "decision_event",
    "rejection_event",
    "refused_completion",
    "completion_events",
    "outcome_document",
]

Event = tuple[str, dict[str, Any]]
"""``(event type, data)`` as :meth:`covenant.audit.writer.AuditLog.record_many` takes it."""


@dataclass(frozen=True)
class ChildOrigin:
    """What the daemon knows of a child intent it is dispatching: the parent's chain entry, the call, its signature."""

    parent: ChainLink
    call: ChildCall
    signature: str


def received_event(
    intent: Intent, *, dry_run: bool, store_text: bool, child: ChildOrigin | None = None, peer_uid: int | None = None
) -> Event:
    """``intent.received``. ``peer_uid`` is kept so that a record made from the log alone (an intent a killed
    daemon left unfinished, :mod:`covenant.daemon.interrupted`) is readable by the user who submitted it."""
    extra: dict[str, Any] = {}
    if child is not None:
        extra = {"signed_by": "daemon", "signature": child.signature, "depth": child.parent.depth + 1,
                 "via": child.call.via, **({"step": child.call.step} if child.call.step else {})}
    return ("intent.received", {
        **extra,
        "intent": intent.id,
        "issuer": intent.issuer.pubkey,
        "issuer_display": intent.issuer.display,
        "agent_requested": intent.agent,
        "priority": intent.priority,
        "parent": intent.parent,
        "issued_at": intent.issued_at,
        "dry_run": dry_run,
        "text": text_digest(intent.text, store_text),
        "peer_uid": peer_uid,
    })


def decision_event(intent: Intent, agent: AgentSpec | None, data: dict[str, Any]) -> Event:
    return ("policy.decision", {"intent": intent.id, "agent": agent.id if agent else None, **data})


def rejection_event(body: object, exc: CovenantError) -> Event:
    """The ``policy.decision`` of an intent rejected before it was verified, with what it claimed (nothing
    of it is trusted, each claim is cut to 200 characters)."""
    claimed = body.get("intent") if isinstance(body, dict) else None
    claimed = claimed if isinstance(claimed, dict) else {}
    issuer = claimed.get("issuer") if isinstance(claimed.get("issuer"), dict) else {}
    return ("policy.decision", {
        "intent": str(claimed.get("id"))[:200] if claimed.get("id") is not None else None,
        "agent": None,
        "allowed": False,
        "reason": exc.code,
        "message": exc.message,
        "claimed_issuer": str(issuer.get("pubkey"))[:200] if issuer.get("pubkey") is not None else None,
    })


def refused_completion(intent: Intent, agent: AgentSpec, code: str) -> Event:
    """``intent.completed`` of an allowed intent that never ran (``overloaded``, ``shutting_down``…)."""
    return ("intent.completed", {"intent": intent.id, "agent": agent.id, "outcome": code, "status": None})


def completion_events(intent: Intent, agent: AgentSpec, record: DispatchRecord, store_text: bool) -> list[Event]:
    """``agent.exited`` (a process agent's) and ``intent.completed`` of a finished record."""
    events: list[Event] = []
    if record.runtime != "rune":  # a Rune intent spawns nothing: its replica answered it
        events.append(("agent.exited", {
            "intent": intent.id,
            "agent": agent.id,
            "pid": record.pid,
            "exit_code": record.exit_code,
            "signal": record.signal,
            "outcome": record.outcome,
            "duration_ms": record.duration_ms,
            "cpu_ms": record.cpu_ms,
            "peak_rss_kib": record.peak_rss_kib,
            "stdout_bytes": record.stdout_bytes,
            "left_behind": record.left_behind,
        }))
    result_text = (record.result or {}).get("text")
    completed = {
        "intent": intent.id,
        "agent": agent.id,
        "outcome": record.outcome,
        "status": (record.result or {}).get("status"),
        "result": text_digest(result_text, store_text) if result_text is not None else None,
    }
    if record.runtime == "rune":
        completed.update(session=record.session_id, usage=record.usage, duration_ms=record.duration_ms)
    events.append(("intent.completed", completed))
    return events


def outcome_document(
    intent: Intent, agent: AgentSpec, routed_by: str, decision: dict[str, Any], record: DispatchRecord
) -> dict[str, Any]:
    """The answer to ``POST /v1/dispatch`` for an intent that ran."""
    result = record.result or {}
    document = {
        "intent_id": intent.id,
        "agent": agent.id,
        "routed_by": routed_by,
        "outcome": record.outcome,
        "exit_code": outcome_exit_code(record.outcome),
        "status": result.get("status"),
        "text": result.get("text"),
        "sources": result.get("sources", []),
        "error": record.error,
        "decision": decision,
        "record": record.model_dump(mode="json"),
    }
    if agent.runtime == "rune":
        document["session_id"] = record.session_id
        document["usage"] = record.usage
        document["input_required"] = result.get("input_required") is True
    return document
