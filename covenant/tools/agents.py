"""Tools that call other agents: ``runtime: agent`` tools and ``rune@agent-send|list|find``.

The tool host never runs another agent itself: it asks :class:`AgentCalls`
(the daemon's child intent path), which decides and runs the call as a child
intent of the calling one. Without it (``covenant run``) such tools fail with
``agent_refused``.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from covenant.tools.context import ToolCallContext
from covenant.tools.result import ToolError

__all__ = ["AgentCalls", "AGENT_TOOL_SCHEMA", "call_agent", "daemon_calls"]

AGENT_TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "What to ask the agent (its user message)."}},
    "required": ["input"],
    "additionalProperties": False,
}
"""Arguments of an agent tool (design/rune-host.md §8): ``{input}``."""


class AgentCalls(Protocol):
    """The daemon's side of agent-to-agent calls."""

    async def call_agent(
        self, ctx: ToolCallContext, agent_ref: str, text: str, *, max_depth: int | None, timeout_s: float
    ) -> dict[str, Any]:
        """Run ``text`` on the agent as a child intent of ``ctx.intent_id``; the outcome document.

        Raises :class:`~covenant.tools.result.ToolError` (``agent_refused``) when it may not run.
        """

    def peers(self, ctx: ToolCallContext) -> list[dict[str, Any]]:
        """The agents ``ctx.agent`` shares a network with: ``{agent, name, description, networks}``."""

    async def send_remote(
        self, ctx: ToolCallContext, url: str, text: str, *, context_id: str | None, timeout_s: float
    ) -> dict[str, Any]:
        """One message to the remote A2A agent at ``url`` for ``ctx.intent_id``: an outcome document."""

    async def discover_remote(self, ctx: ToolCallContext, url: str, *, timeout_s: float) -> dict[str, Any]:
        """The remote A2A agent's card, summarised."""

    async def spawn(self, ctx: ToolCallContext, manifest: str) -> dict[str, Any]:
        """A new ``<name>@spawned-<key id>`` agent from Runefile text: ``{agent_id, expires_at}``."""

    async def kill(self, ctx: ToolCallContext, agent_id: str) -> dict[str, Any]:
        """Remove an agent this one spawned: ``{agent_id, killed}``."""


def daemon_calls(agents: AgentCalls | None, code: str = "agent_refused") -> AgentCalls:
    """The daemon's side of calls between agents; ToolError ``code`` without it (``covenant run``)."""
    if agents is None:
        raise ToolError(code, "calls between agents are made by the daemon (not available under `covenant run`)")
    return agents


async def call_agent(
    agents: AgentCalls | None, ctx: ToolCallContext, agent_ref: str, text: str, *, max_depth: int | None, ends: float
) -> dict[str, Any]:
    """One call to another agent, ending by ``ends``: the tool's result, or ToolError."""
    agents = daemon_calls(agents)
    timeout_s = max(0.0, ends - trio.current_time())
    if agent_ref.startswith(("http://", "https://")):
        document = await agents.send_remote(ctx, agent_ref, text, context_id=None, timeout_s=timeout_s)
    else:
        document = await agents.call_agent(ctx, agent_ref, text, max_depth=max_depth, timeout_s=timeout_s)
    if document.get("outcome") != "ok":
        raise ToolError(
            "agent_failed",
            f"agent {document.get('agent')} ended with outcome {document.get('outcome')}: {document.get('error') or 'no detail'}",
        )
    return {"agent": document.get("agent"), "intent_id": document.get("intent_id"), "text": document.get("text")}
