"""``rune@a2a-send`` and ``rune@a2a-discover``: remote A2A agents, called by the daemon for the agent.

The replica never reaches the network: the daemon makes the call, only to a
URL under ``[a2a] remotes`` (docs/a2a.md), bounded by the intent's deadline.
Without remotes configured both tools are unavailable (never offered).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from covenant.tools.agents import daemon_calls
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.result import ToolError

if TYPE_CHECKING:
    from covenant.config import Config

__all__ = ["TOOLS"]

_URL = {"type": "string", "minLength": 8, "maxLength": 2000, "pattern": "^https?://"}


def _needs_remotes(config: Config) -> str | None:
    return None if config.a2a.remotes else "no remote agents are allowed: set [a2a] remotes in covenant.toml"


def _timeout_ms(config: Config, arguments: dict[str, Any]) -> int:
    return config.a2a.call_timeout_ms


async def _send(call: BuiltinCall) -> dict[str, Any]:
    document = await daemon_calls(call.services.agents).send_remote(
        call.ctx, call.arguments["agent_url"], call.arguments["message"],
        context_id=call.arguments.get("context_id"), timeout_s=max(0.0, call.ends - trio.current_time()))
    if document["outcome"] != "ok":
        raise ToolError("agent_failed", f"{call.arguments['agent_url']}: {document['outcome']}: {document.get('error')}")
    remote = document["remote"]
    return {"text": document["text"], "task_id": remote["task_id"], "state": remote["state"],
            "context_id": remote["context_id"]}


async def _discover(call: BuiltinCall) -> dict[str, Any]:
    return await daemon_calls(call.services.agents).discover_remote(call.ctx, call.arguments["url"],
                                               timeout_s=max(0.0, call.ends - trio.current_time()))


TOOLS = (
    Builtin(
        name="rune@a2a-send",
        description="Send a message to a remote A2A agent by its URL and get its answer. context_id (from an "
        "earlier answer) continues that conversation.",
        parameters={
            "type": "object",
            "properties": {"agent_url": _URL, "message": {"type": "string", "minLength": 1},
                           "context_id": {"type": "string", "minLength": 1, "maxLength": 200}},
            "required": ["agent_url", "message"],
            "additionalProperties": False,
        },
        run=_send,
        timeout_ms=_timeout_ms,
        needs=_needs_remotes,
    ),
    Builtin(
        name="rune@a2a-discover",
        description="Read a remote A2A agent's card: its name, description, skills and interface.",
        parameters={"type": "object", "properties": {"url": _URL}, "required": ["url"], "additionalProperties": False},
        run=_discover,
        timeout_ms=_timeout_ms,
        needs=_needs_remotes,
    ),
)
