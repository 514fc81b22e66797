"""The answer to a fleet intent: what is published on ``covenant.result.<intent id>`` (design/fleet.md §3).

Pure; no I/O. An answer is the daemon's ``/v1/dispatch`` answer — the outcome
document, or for a refusal the error document ``{"error": {...}}`` — with
``host`` (which host answered) and ``deliveries`` (how many deliveries it took)
added at the top level (a refusal also gets ``intent_id``). An intent this host already ran is answered from its
dispatch record, in the outcome document's shape with ``from_record: true``.
"""

from __future__ import annotations

import json
from typing import Any

from covenant.client import EXIT_BY_CODE
from covenant.errors import ExitCode, error_document

__all__ = [
    "DELIVERY_EXHAUSTED",
    "answer",
    "refusal",
    "from_record",
    "delivery_exhausted",
    "exit_code",
    "outcome_of",
    "encode",
    "fit",
]

DELIVERY_EXHAUSTED = "delivery_exhausted"

# Refusals a host answers with that the daemon never does; the rest map as for a local dispatch.
_FLEET_EXIT: dict[str, int] = {DELIVERY_EXHAUSTED: ExitCode.AGENT_FAILED}


def answer(document: dict[str, Any], intent_id: str, host: str, deliveries: int) -> dict[str, Any]:
    """The daemon's answer as published: the document plus ``host`` and ``deliveries`` (and, for a
    refusal, which carries none, ``intent_id``)."""
    return {"intent_id": intent_id, **document, "host": host, "deliveries": deliveries}


def refusal(code: str, message: str, intent_id: str, host: str, deliveries: int, **details: Any) -> dict[str, Any]:
    """An error document answered by the fleet itself."""
    return answer(error_document(code, message, **details), intent_id, host, deliveries)


def from_record(record: dict[str, Any], host: str, deliveries: int) -> dict[str, Any]:
    """The answer for an intent this host ran already, rebuilt from its dispatch record.

    The shape of the outcome document; ``routed_by`` and ``decision`` are not kept in a
    record and are null (the host's audit log has the decision).
    """
    from covenant.runtime.outcome import OUTCOMES, outcome_exit_code  # pydantic: the fleet process only, not the CLI

    result = record.get("result") or {}
    outcome = record.get("outcome")
    document: dict[str, Any] = {
        "intent_id": record.get("intent_id"),
        "agent": record.get("agent_id"),
        "routed_by": None,
        "outcome": outcome,
        "exit_code": outcome_exit_code(outcome) if outcome in OUTCOMES else ExitCode.AGENT_FAILED,  # type: ignore[arg-type]
        "status": result.get("status"),
        "text": result.get("text"),
        "sources": result.get("sources", []),
        "error": record.get("error"),
        "decision": None,
        "record": record,
        "from_record": True,
    }
    if record.get("runtime") == "rune":
        document["session_id"] = record.get("session_id")
        document["usage"] = record.get("usage")
    return answer(document, str(record.get("intent_id")), host, deliveries)


def delivery_exhausted(intent_id: str, agent: str | None, host: str, deliveries: int, max_deliver: int) -> dict[str, Any]:
    """``failed`` with reason ``delivery_exhausted``: no host answered within ``max_deliver`` deliveries."""
    return refusal(
        DELIVERY_EXHAUSTED,
        f"intent {intent_id} was delivered {deliveries} time(s) (max_deliver {max_deliver}) and no host could run "
        "it to an answer (hosts that died or were overloaded); nothing more will try. Dispatch it again when the hosts "
        "are healthy: `covenant fleet status` shows them",
        intent_id, host, deliveries, outcome="failed", reason=DELIVERY_EXHAUSTED, intent=intent_id, agent=agent,
        max_deliver=max_deliver,
    )


def exit_code(document: dict[str, Any]) -> int:
    """What ``covenant dispatch --fleet`` exits with for this answer (the codes of a local dispatch)."""
    error = document.get("error")
    if isinstance(error, dict):
        code = str(error.get("code"))
        return _FLEET_EXIT.get(code, EXIT_BY_CODE.get(code, ExitCode.USAGE))
    value = document.get("exit_code")
    return value if type(value) is int else ExitCode.AGENT_FAILED


def outcome_of(document: dict[str, Any]) -> str:
    """One word for the audit log's ``fleet.ack``: the outcome, or the refusal's code."""
    error = document.get("error")
    if isinstance(error, dict):
        return str(error.get("code") or "error")[:64]
    return str(document.get("outcome") or "unknown")[:64]


def encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def fit(document: dict[str, Any], max_bytes: int) -> bytes:
    """``document`` encoded, within ``max_bytes`` (NATS ``max_payload``, 1 MiB by default).

    An agent may answer up to ``[runtime] stdout_cap_bytes`` (1 MiB too), and the dispatch
    record rides along: an answer that does not fit loses its ``record`` first, then its text,
    and says so in ``trimmed``; the whole answer stays in the host's dispatch record
    (``covenant show ID`` there).
    """
    payload = encode(document)
    if len(payload) <= max_bytes:
        return payload
    trimmed = {**document, "record": None, "trimmed": {"bytes": len(payload), "max_payload": max_bytes,
                                                       "whole_on": document.get("host")}}
    payload = encode(trimmed)
    if len(payload) <= max_bytes:
        return payload
    return encode({**trimmed, "text": None, "sources": []})
