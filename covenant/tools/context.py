"""Who is calling a tool, for which intent, under which grants, until when."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from covenant.manifest.model import AgentSpec
from covenant.policy.grants import GrantSet

__all__ = ["AuditSink", "IntentModels", "ToolCallContext"]

AuditSink = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Records one audit event: ``await sink(event_type, data)`` (the daemon's audit writer)."""


class IntentModels(Protocol):
    """The intent's own model calls, lent to a tool by the daemon: through its gateway like any model call of the
    agent (its providers, the intent's token budget, one ``model.call`` event each). Both raise
    :class:`~covenant.tools.result.ToolError` when the call fails."""

    async def ask(self, messages: list[dict[str, Any]]) -> str:
        """The agent's model's text answer to ``messages`` (neutral OpenAI-format, images as inline data URLs)."""
        ...

    async def generate_image(self, provider: str, model: str, prompt: str, size: str | None) -> bytes:
        """One image from ``[providers.<provider>]``'s images endpoint."""
        ...


@dataclass(frozen=True)
class ToolCallContext:
    """One tool call's circumstances; build it per call (or per turn) with the current grants.

    ``grants`` is the daemon's current :class:`~covenant.policy.grants.GrantSet`
    (the one its capability check uses). Grants are judged at the later of
    ``now_ms`` and the wall clock when the call is checked, so an expiry
    during a long intent is never missed.
    """

    intent_id: str
    agent: AgentSpec
    """The Rune agent whose toolset is used."""
    issuer_pubkey: str
    """Hex public key of the intent's issuer: the one whose grants decide."""
    grants: GrantSet
    now_ms: int
    deadline: float
    """``trio.current_time()`` by which the intent must end; no tool runs past it."""
    models: IntentModels | None = None
    """The intent's model calls (``rune@image-analyze``, ``rune@image-generate``); None outside the daemon."""
    session_id: str | None = None
    """The dispatch's session when its caller named one: the agent's browser is kept per session
    (:mod:`covenant.tools.browsers`); None: per intent."""
    priority: str = "normal"
    """The intent's priority (``dispatch --priority``): it moves the nice of the processes run for the call."""

    def run_marker(self) -> str:
        """A unique marker for one tool run of this call (``COVENANT_INTENT_ID`` of its processes)."""
        return f"{self.intent_id}:tool:{secrets.token_hex(6)}"
