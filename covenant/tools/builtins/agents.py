"""``rune@agent-send``, ``rune@agent-list``, ``rune@agent-find``: agents calling agents by name;
``rune@agent-spawn`` and ``rune@agent-kill``: agents made at run time (covenant/daemon/spawned.py).

``agent-send`` is a child intent like an agent tool (network rule, depth,
the root issuer's grants); ``agent-list`` and ``agent-find`` only show the
agents the caller shares a network with, the ones a send could reach.
"""

from __future__ import annotations

from typing import Any

from covenant.tools.agents import call_agent, daemon_calls
from covenant.tools.builtins.base import NO_ARGUMENTS, Builtin, BuiltinCall

__all__ = ["TOOLS"]

_SEND_TIMEOUT_S = 60.0


def _peers(call: BuiltinCall) -> list[dict[str, Any]]:
    return daemon_calls(call.services.agents).peers(call.ctx)


async def _send(call: BuiltinCall) -> dict[str, Any]:
    import trio

    ends = min(trio.current_time() + _SEND_TIMEOUT_S, call.ctx.deadline)
    return await call_agent(
        call.services.agents, call.ctx, call.arguments["agent"], call.arguments["input"], max_depth=None, ends=ends
    )


async def _spawn(call: BuiltinCall) -> dict[str, Any]:
    return await daemon_calls(call.services.agents, "spawn_refused").spawn(call.ctx, call.arguments["manifest"])


async def _kill(call: BuiltinCall) -> dict[str, Any]:
    return await daemon_calls(call.services.agents, "spawn_refused").kill(call.ctx, call.arguments["agent_id"])


async def _list(call: BuiltinCall) -> dict[str, Any]:
    return {"agents": _peers(call)}


async def _find(call: BuiltinCall) -> dict[str, Any]:
    query = call.arguments["query"].casefold()
    found = [p for p in _peers(call) if query in p["name"].casefold() or query in p["description"].casefold()]
    return {"agents": found}


TOOLS = (
    Builtin(
        name="rune@agent-spawn",
        description="Create a helper agent from a Runefile (YAML text). Its toolset must be a subset of yours; "
        "it lives until agent-kill or its time runs out. Talk to it with agent-send and the agent_id returned.",
        parameters={
            "type": "object",
            "properties": {"manifest": {"type": "string", "minLength": 1, "maxLength": 65536}},
            "required": ["manifest"],
            "additionalProperties": False,
        },
        run=_spawn,
    ),
    Builtin(
        name="rune@agent-kill",
        description="Remove an agent you spawned (the agent_id agent-spawn answered, e.g. helper@spawned-3f2a9c01d4e5).",
        parameters={
            "type": "object",
            "properties": {"agent_id": {"type": "string", "minLength": 1, "maxLength": 200}},
            "required": ["agent_id"],
            "additionalProperties": False,
        },
        run=_kill,
    ),
    Builtin(
        name="rune@agent-send",
        description="Ask another agent (one that shares a network with you) and get its answer. "
        "agent is its name or id, input what to ask it.",
        parameters={
            "type": "object",
            "properties": {"agent": {"type": "string", "minLength": 1, "maxLength": 200}, "input": {"type": "string"}},
            "required": ["agent", "input"],
            "additionalProperties": False,
        },
        run=_send,
    ),
    Builtin(
        name="rune@agent-list",
        description="The agents you can call with agent-send (the ones sharing a network with you).",
        parameters=NO_ARGUMENTS,
        run=_list,
    ),
    Builtin(
        name="rune@agent-find",
        description="Agents you can call whose name or description contains query.",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200}},
            "required": ["query"],
            "additionalProperties": False,
        },
        run=_find,
    ),
)
