"""``rune@schedule-create|list|delete``: daemon schedules made by an agent, bound to its intent's issuer.

The issue's ``schedule.create`` is the capability action of
``rune@schedule-create`` in covenant's mapping, ``tool.schedule_create``
(``tool.schedule_list``, ``tool.schedule_delete`` for the others), checked by
the tool host before the tool runs. A schedule keeps acting for that issuer
after the intent ends; its firings are decided by the issuer's grants at
each firing, like any other intent (docs/triggers.md).
"""

from __future__ import annotations

from typing import Any

import trio
from pydantic import ValidationError

from covenant.clock import now_ms
from covenant.policy.identities import KnownIdentities
from covenant.tools.builtins.base import NO_ARGUMENTS, Builtin, BuiltinCall
from covenant.tools.result import ToolError
from covenant.triggers.agent_schedules import AgentScheduleStore, agent_schedules_path
from covenant.triggers.config import ScheduleConfig

__all__ = ["TOOLS"]


def _store(call: BuiltinCall) -> AgentScheduleStore:
    return AgentScheduleStore(agent_schedules_path(call.services.home.state_dir))


def _view(schedule: ScheduleConfig) -> dict[str, Any]:
    """A schedule as the tools answer it; ``id`` is its name (what schedule-delete takes)."""
    return {"id": schedule.name, "name": schedule.name, "agent": schedule.agent, "input": schedule.input,
            "every": schedule.every, "cron": schedule.cron}


async def _create(call: BuiltinCall) -> dict[str, Any]:
    args = call.arguments
    if args["name"] in {s.name for s in call.services.config.schedules}:
        raise ToolError("tool_failed", f"{args['name']!r} is the name of a schedule in covenant.toml")
    home = call.services.home
    display = await trio.to_thread.run_sync(KnownIdentities(home).display_for, call.ctx.issuer_pubkey)
    agent = args.get("agent") or call.ctx.agent.id
    if agent == call.ctx.agent.name:  # this agent by its bare name (the reference's agent_name): its full id
        agent = call.ctx.agent.id
    try:
        schedule = ScheduleConfig(name=args["name"], agent=agent,
                                  input=args.get("input", ""), every=args.get("every"), cron=args.get("cron"),
                                  issuer=display or f"issuer-{call.ctx.issuer_pubkey[:16]}")
    except ValidationError as exc:
        problems = (str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise ToolError("invalid_arguments", "; ".join(problems)) from None
    refused = await trio.to_thread.run_sync(
        _store(call).add, schedule, call.ctx.issuer_pubkey, call.ctx.agent.id, now_ms())
    if refused is not None:
        raise ToolError("tool_failed", refused)
    return {"created": True, "schedule_id": schedule.name, **_view(schedule)}


async def _list(call: BuiltinCall) -> dict[str, Any]:
    mine = [s for s, pubkey in await trio.to_thread.run_sync(_store(call).schedules) if pubkey == call.ctx.issuer_pubkey]
    return {"schedules": [_view(s) for s in mine], "count": len(mine)}


async def _delete(call: BuiltinCall) -> dict[str, Any]:
    deleted = await trio.to_thread.run_sync(_store(call).delete, call.arguments["name"], call.ctx.issuer_pubkey)
    return {"deleted": deleted, "name": call.arguments["name"]}


_NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"}

TOOLS = (
    Builtin(
        name="rune@schedule-create",
        description=("Create a daemon schedule that sends `input` to `agent` (default: this agent) every period "
                     "(`every`: \"30s\", \"10m\", \"2h\") or at cron times in UTC (`cron`: \"0 9 * * 1-5\"); "
                     "exactly one of every and cron. It acts for the issuer of this intent."),
        parameters={"type": "object", "additionalProperties": False, "required": ["name"],
                    "properties": {"name": _NAME, "agent": {"type": "string", "minLength": 1, "maxLength": 256},
                                   "input": {"type": "string", "maxLength": 16384},
                                   "every": {"type": "string", "maxLength": 16},
                                   "cron": {"type": "string", "maxLength": 128}}},
        run=_create,
    ),
    Builtin(name="rune@schedule-list", description="The schedules this intent's issuer created with schedule-create.",
            parameters=NO_ARGUMENTS, run=_list),
    Builtin(name="rune@schedule-delete", description="Delete a schedule this intent's issuer created, by name.",
            parameters={"type": "object", "additionalProperties": False, "required": ["name"],
                        "properties": {"name": _NAME}}, run=_delete),
)
