"""``rune@process-start|poll|write|kill|list``: the agent's supervised processes (:mod:`covenant.tools.supervised`)."""

from __future__ import annotations

from typing import Any

import trio

from covenant.config import Config
from covenant.tools.builtins.base import NO_ARGUMENTS, Builtin, BuiltinCall
from covenant.tools.builtins.shell import SHELL
from covenant.tools.result import ToolError

__all__ = ["START", "POLL", "WRITE", "KILL", "LIST", "TOOLS"]

_ID = {"type": "string", "pattern": "^p-[0-9]{1,12}$", "description": "the id process-start returned"}
_WAIT_MAX_MS = 600_000


def _one_id(extra: dict[str, Any] | None = None, required: tuple[str, ...] = ("id",)) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"id": _ID, **(extra or {})},
        "required": list(required),
        "additionalProperties": False,
    }


async def _start(call: BuiltinCall) -> dict[str, Any]:
    left_ms = int((call.ctx.deadline - trio.current_time()) * 1000)
    if left_ms <= 0:
        raise ToolError("tool_timeout", "the intent has no time left to run a process")
    workspace = await trio.to_thread.run_sync(call.services.workspace, call.ctx.agent.id)
    process = await call.services.processes.start(
        call.ctx.agent, call.ctx.intent_id, call.arguments["command"], str(workspace.root), left_ms, SHELL,
        call.ctx.priority,
    )
    return {"id": process.id, "running": process.running, "pid": process.state.launched.pid if process.state else None}


async def _poll(call: BuiltinCall) -> dict[str, Any]:
    return await call.services.processes.poll(call.ctx.agent.id, call.arguments["id"], call.arguments.get("wait_ms", 0))


def _poll_timeout_ms(config: Config, arguments: dict[str, Any]) -> int:
    return int(arguments.get("wait_ms", 0)) + 5000


async def _write(call: BuiltinCall) -> dict[str, Any]:
    a = call.arguments
    return await call.services.processes.write(call.ctx.agent.id, a["id"], a.get("data", ""), bool(a.get("close", False)))


async def _kill(call: BuiltinCall) -> dict[str, Any]:
    return await call.services.processes.kill(call.ctx.agent.id, call.arguments["id"])


async def _list(call: BuiltinCall) -> dict[str, Any]:
    return call.services.processes.list(call.ctx.agent.id)


START = Builtin(
    name="rune@process-start",
    description=(
        "Start a long-running shell command (/bin/sh -c) in your workspace, as your own user under your limits, and "
        "return its id at once. It is stopped when this request ends. Read its output with process-poll."
    ),
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string", "minLength": 1, "maxLength": 64 * 1024}},
        "required": ["command"],
        "additionalProperties": False,
    },
    run=_start,
)

POLL = Builtin(
    name="rune@process-poll",
    description=(
        "The output a process wrote since the last poll, whether it still runs, and how it ended. wait_ms: first "
        "wait up to that long for it to end."
    ),
    parameters=_one_id({"wait_ms": {"type": "integer", "minimum": 0, "maximum": _WAIT_MAX_MS}}),
    run=_poll,
    timeout_ms=_poll_timeout_ms,
)

WRITE = Builtin(
    name="rune@process-write",
    description="Write text to a running process's stdin; close: true closes its stdin afterwards (end of input).",
    parameters=_one_id({"data": {"type": "string", "maxLength": 64 * 1024}, "close": {"type": "boolean"}}),
    run=_write,
)

KILL = Builtin(
    name="rune@process-kill",
    description="Stop a process and everything it started; returns how it ended.",
    parameters=_one_id(),
    run=_kill,
)

LIST = Builtin(
    name="rune@process-list",
    description="Your processes: running ones, and finished ones whose output was not all polled yet.",
    parameters=NO_ARGUMENTS,
    run=_list,
)

TOOLS = (START, POLL, WRITE, KILL, LIST)
