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

__all__ = ["TOOLS", "issuer_display", "new_schedule", "schedule_store", "schedule_view", "store_schedule"]


def schedule_store(call: BuiltinCall) -> AgentScheduleStore:
    """The home's store of agent-made schedules (``rune@schedule-*`` and ``rune@cron-*`` share it)."""
    return AgentScheduleStore(agent_schedules_path(call.services.home.state_dir))


async def issuer_display(call: BuiltinCall) -> str:
    """The display name a schedule fires for: the intent's issuer as identities.toml names it."""
    display = await trio.to_thread.run_sync(KnownIdentities(call.services.home).display_for, call.ctx.issuer_pubkey)
    return display or f"issuer-{call.ctx.issuer_pubkey[:16]}"


def new_schedule(**fields: Any) -> ScheduleConfig:
    """A ScheduleConfig from a call's arguments; ToolError ``invalid_arguments`` naming what is wrong."""
    try:
        return ScheduleConfig(**fields)
    except ValidationError as exc:
        problems = (str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise ToolError("invalid_arguments", "; ".join(problems)) from None


async def store_schedule(call: BuiltinCall, schedule: ScheduleConfig, made_with: str) -> None:
    """Keep ``schedule`` for this intent's issuer, made by this agent; ToolError when its name is taken."""
    if schedule.name in {s.name for s in call.services.config.schedules}:
        raise ToolError("tool_failed", f"{schedule.name!r} is the name of a schedule in covenant.toml")
    refused = await trio.to_thread.run_sync(
        lambda: schedule_store(call).add(schedule, call.ctx.issuer_pubkey, call.ctx.agent.id, now_ms(), made_with))
    if refused is not None:
        raise ToolError("tool_failed", refused)


def schedule_view(schedule: ScheduleConfig) -> dict[str, Any]:
    """A schedule as the tools answer it; ``id`` is its name (what schedule-delete takes)."""
    return {"id": schedule.name, "name": schedule.name, "agent": schedule.agent, "input": schedule.input,
            "every": schedule.every, "cron": schedule.cron}


async def _create(call: BuiltinCall) -> dict[str, Any]:
    args = call.arguments
    agent = args.get("agent") or call.ctx.agent.id
    if agent == call.ctx.agent.name:  # this agent by its bare name (the reference's agent_name): its full id
        agent = call.ctx.agent.id
    schedule = new_schedule(name=args["name"], agent=agent, input=args.get("input", ""), every=args.get("every"),
                            cron=args.get("cron"), issuer=await issuer_display(call))
    await store_schedule(call, schedule, "rune@schedule-create")
    return {"created": True, "schedule_id": schedule.name, **schedule_view(schedule)}


async def _list(call: BuiltinCall) -> dict[str, Any]:
    mine = [s for s, pubkey in await trio.to_thread.run_sync(schedule_store(call).schedules) if pubkey == call.ctx.issuer_pubkey]
    return {"schedules": [schedule_view(s) for s in mine], "count": len(mine)}


async def _delete(call: BuiltinCall) -> dict[str, Any]:
    deleted = await trio.to_thread.run_sync(schedule_store(call).delete, call.arguments["name"], call.ctx.issuer_pubkey)
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
