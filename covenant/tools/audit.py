"""The ``tool.call`` audit event: one per call the model makes, arguments as a SHA-256 only."""

from __future__ import annotations

import hashlib
from typing import Any

from covenant.audit.events import TOOL_CALL
from covenant.canonical import canonical_bytes
from covenant.tools.catalogue import MODEL_NAME

__all__ = ["TOOL_CALL", "args_sha256", "tool_call_event"]

def args_sha256(arguments: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of the parsed arguments; of the raw UTF-8 text when they did not parse."""
    if isinstance(arguments, str):
        raw = arguments.encode("utf-8", "surrogatepass")
    else:
        try:
            raw = canonical_bytes(arguments)
        except (TypeError, ValueError, RecursionError):
            raw = repr(arguments).encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()


def tool_call_event(
    *,
    intent: str,
    agent: str,
    name: str,
    action: str | None,
    digest: str,
    outcome: str,
    error_code: str | None,
    attempts: int,
    left_behind: int,
    ms: int,
    aliases: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The event's data. A name that is not a valid tool name is recorded as its SHA-256 only.

    ``name`` comes from the model and may hold anything; a well-formed one is
    at most 64 characters of ``[A-Za-z0-9_-]`` and is kept as is. ``aliases``: the argument names of the
    reference runtime mapped onto covenant's (``args_aliases``, present only when some were).
    """
    data: dict[str, Any] = {
        "intent": intent,
        "agent": agent,
        "name": name if MODEL_NAME.match(name) else None,
        "tool": action,
        "args_sha256": digest,
        "outcome": outcome,
        "error_code": error_code,
        "attempts": attempts,
        "left_behind": left_behind,
        "ms": ms,
    }
    if aliases:
        data["args_aliases"] = list(aliases)
    if data["name"] is None:
        data["name_sha256"] = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return data
