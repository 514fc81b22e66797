"""Event types covenant records, and helpers to build their data safely.

docs/audit.md lists the fields each event carries; the daemon follows it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from covenant.audit.errors import AuditDataError
from covenant.audit.format import AUDIT_ERROR, TYPE_RE, WRITER_TYPES
from covenant.canonical import canonical_bytes

__all__ = [
    "AUDIT_ERROR",
    "DAEMON_START",
    "DAEMON_STOP",
    "REGISTRY_LOADED",
    "CONFIG_RELOADED",
    "MANIFEST_REJECTED",
    "INTENT_RECEIVED",
    "POLICY_DECISION",
    "AGENT_SPAWNED",
    "AGENT_EXITED",
    "AGENT_STOPPED",
    "AGENT_STARTED",
    "INTENT_COMPLETED",
    "INTENT_INTERRUPTED",
    "GRANT_ADDED",
    "GRANT_REVOKED",
    "MODEL_CALL",
    "TOOL_CALL",
    "MEMORY_RECOVER",
    "STORE_RECOVER",
    "SCHEDULE_FIRE",
    "SCHEDULE_SKIPPED",
    "WEBHOOK_REQUEST",
    "FLEET_DELIVERY",
    "FLEET_ACK",
    "ISOLATION_SWEEP",
    "SESSION_LOADED",
    "EVENT_TYPES",
    "text_digest",
    "encode_event_data",
    "fleet_event_data",
]

DAEMON_START = "daemon.start"
DAEMON_STOP = "daemon.stop"
REGISTRY_LOADED = "registry.loaded"
CONFIG_RELOADED = "config.reloaded"
MANIFEST_REJECTED = "manifest.rejected"
INTENT_RECEIVED = "intent.received"
POLICY_DECISION = "policy.decision"
AGENT_SPAWNED = "agent.spawned"
AGENT_EXITED = "agent.exited"
INTENT_COMPLETED = "intent.completed"
INTENT_INTERRUPTED = "intent.interrupted"
GRANT_ADDED = "grant.added"
GRANT_REVOKED = "grant.revoked"
MODEL_CALL = "model.call"
TOOL_CALL = "tool.call"
MEMORY_RECOVER = "memory.recover"
STORE_RECOVER = "store.recover"
SCHEDULE_FIRE = "schedule.fire"
SCHEDULE_SKIPPED = "schedule.skipped"
WEBHOOK_REQUEST = "webhook.request"
A2A_REQUEST = "a2a.request"
A2A_CALL = "a2a.call"
AGENT_SPAWN = "agent.spawn"
AGENT_KILL = "agent.kill"
AGENT_STOPPED = "agent.stopped"
AGENT_STARTED = "agent.started"
FLEET_DELIVERY = "fleet.delivery"
FLEET_ACK = "fleet.ack"
ISOLATION_SWEEP = "isolation.sweep"
SESSION_LOADED = "session.loaded"

EVENT_TYPES = frozenset(
    {
        DAEMON_START,
        DAEMON_STOP,
        REGISTRY_LOADED,
        CONFIG_RELOADED,
        MANIFEST_REJECTED,
        INTENT_RECEIVED,
        POLICY_DECISION,
        AGENT_SPAWNED,
        AGENT_EXITED,
        INTENT_COMPLETED,
        INTENT_INTERRUPTED,
        GRANT_ADDED,
        GRANT_REVOKED,
        MODEL_CALL,
        TOOL_CALL,
        MEMORY_RECOVER,
        STORE_RECOVER,
        SCHEDULE_FIRE,
        SCHEDULE_SKIPPED,
        WEBHOOK_REQUEST,
        A2A_REQUEST,
        A2A_CALL,
        AGENT_SPAWN,
        AGENT_KILL,
        AGENT_STOPPED,
        AGENT_STARTED,
        FLEET_DELIVERY,
        FLEET_ACK,
        ISOLATION_SWEEP,
        SESSION_LOADED,
    }
)

# The fields of the two events `covenant fleet` has its daemon record (docs/audit.md), each with its type.
_FLEET_FIELDS: dict[str, dict[str, type]] = {
    FLEET_DELIVERY: {"intent": str, "delivery": int, "consumer": str, "host": str},
    FLEET_ACK: {"intent": str, "outcome": str, "delivery": int, "ack": str},
}
_FLEET_ACKS = frozenset({"ack", "term", "nak"})
_FLEET_TEXT_MAX = 256


def text_digest(text: str, store_text: bool) -> dict[str, Any]:
    """How intent and result text goes into the log: sha256 + UTF-8 length, plus the text if configured.

    >>> text_digest("hi", False)["bytes"]
    2
    """
    # surrogatepass: text decoded from JSON may hold lone surrogates ("\\ud800");
    # they must still get a digest rather than fail the dispatch.
    raw = text.encode("utf-8", "surrogatepass")
    out: dict[str, Any] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    if store_text:
        out["text"] = raw.decode("utf-8", "replace")
    return out


def _refusal(value: Any) -> tuple[str, str] | None:
    """Where below ``value`` and why the log refuses it, e.g. ``(".limits.cpu", "is a float (0.5); ...")``;
    None when it holds only str, int, bool, None, lists, tuples and dicts with str keys.

    Floats are refused outright: canonical JSON of a float is not stable across
    languages, and verify rejects any line that holds one. The path is built only
    on the way back from a refusal: every event is checked, almost none is refused.
    """
    kind = type(value)
    if value is None or kind is str or kind is int or kind is bool:
        return None
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return "", f"has a non-string key {key!r}"
            if (found := _refusal(item)) is not None:
                return f".{key}{found[0]}", found[1]
        return None
    if kind is list or kind is tuple:
        for index, item in enumerate(value):
            if (found := _refusal(item)) is not None:
                return f"[{index}]{found[0]}", found[1]
        return None
    if kind is float:
        return "", f"is a float ({value!r}); record integers (e.g. milliseconds) instead"
    return "", f"has unsupported type {kind.__name__}; use str, int, bool, list or dict"


def encode_event_data(type_: str, data: dict[str, Any], *, writer: bool = False) -> bytes:
    """Validate an event and return its data as canonical JSON bytes.

    Raises AuditDataError for a malformed type, a reserved ``audit.*`` type
    (unless ``writer``), floats, non-string keys or text that is not valid UTF-8.
    """
    if not isinstance(type_, str) or not TYPE_RE.fullmatch(type_):
        raise AuditDataError(f"audit event type {type_!r} must be dotted lowercase words, e.g. intent.received")
    if type_ in WRITER_TYPES and not writer:
        raise AuditDataError(f"audit event type {type_!r} is reserved for the audit writer")
    if type(data) is not dict:
        raise AuditDataError(f"audit data for {type_} must be a dict, not {type(data).__name__}")
    if (refused := _refusal(data)) is not None:
        where, problem = refused
        raise AuditDataError(f"audit data data{where} {problem}")
    try:
        return canonical_bytes(data)
    except (ValueError, UnicodeEncodeError) as exc:
        raise AuditDataError(f"audit data for {type_} cannot be encoded: {exc}") from None


def fleet_event_data(type_: Any, data: Any) -> dict[str, Any]:
    """The data of a ``fleet.delivery`` or ``fleet.ack`` event as the fleet process sent it, checked.

    Exactly the documented fields, each of its type (strings of 1-256 characters, a delivery
    number from 1, ``ack`` one of ack, term, nak); anything else raises AuditDataError naming it.
    """
    fields = _FLEET_FIELDS.get(type_) if isinstance(type_, str) else None
    if fields is None:
        raise AuditDataError(f"type must be one of {', '.join(sorted(_FLEET_FIELDS))}, not {type_!r}")
    if type(data) is not dict or set(data) != set(fields):
        got = sorted(data) if type(data) is dict else type(data).__name__
        raise AuditDataError(f"{type_} data must have exactly the fields {', '.join(sorted(fields))}; got {got}")
    for name, kind in fields.items():
        value = data[name]
        if type(value) is not kind:
            raise AuditDataError(f"{type_} data.{name} must be a {kind.__name__}, not {type(value).__name__}")
        if kind is str and not 0 < len(value) <= _FLEET_TEXT_MAX:
            raise AuditDataError(f"{type_} data.{name} must be 1-{_FLEET_TEXT_MAX} characters")
        if kind is int and not 0 < value < 2**31:
            raise AuditDataError(f"{type_} data.{name} must be a delivery number from 1")
    if type_ == FLEET_ACK and data["ack"] not in _FLEET_ACKS:
        raise AuditDataError(f"fleet.ack data.ack must be one of {', '.join(sorted(_FLEET_ACKS))}")
    return dict(data)
