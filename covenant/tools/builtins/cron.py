"""``rune@cron-create|list|cancel``: the reference runtime's recurring jobs, kept as daemon schedules.

A cron job is an agent-made schedule like those of ``rune@schedule-create``: the same store
(``<home>/state/agent-schedules.json``), the same runner, listed by ``covenant schedules``, firing
for the issuer of the intent that made it (its grants decide each firing). What differs is the
shape, which is the reference runtime's: ``{name, schedule, action}`` where ``schedule`` is a cron
line or words ("every 5 minutes", "daily at 9am", UTC) and ``action`` is what this agent is told at
each firing. A job always runs this agent; cron-list and cron-cancel see only the jobs this agent
made for this issuer (``made_with`` says which tool made each).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import trio

from covenant.tools.builtins.base import NO_ARGUMENTS, Builtin, BuiltinCall
from covenant.tools.builtins.schedules import issuer_display, new_schedule, schedule_store, schedule_view, store_schedule
from covenant.tools.reference_args import ShapeError, parse_schedule
from covenant.tools.result import ToolError
from covenant.triggers.config import SCHEDULE_NAME

__all__ = ["TOOLS", "job_id"]

_NOT_IN_ID = re.compile(r"[^A-Za-z0-9_.-]+")


def job_id(name: str) -> str:
    """A job's id from its name: the name itself when it is a schedule name already, else its letters, digits
    and ``_.-`` with each other run of characters as one ``-`` (``"Daily report"`` -> ``Daily-report``)."""
    if SCHEDULE_NAME.match(name):
        return name
    slug = _NOT_IN_ID.sub("-", name).strip("-._")[:64]
    return slug if SCHEDULE_NAME.match(slug) else f"cron-{secrets.token_hex(6)}"


async def _create(call: BuiltinCall) -> dict[str, Any]:
    args = call.arguments
    try:
        kind, timing = parse_schedule(args["schedule"])
    except ShapeError as exc:
        raise ToolError("invalid_arguments", str(exc)) from None
    schedule = new_schedule(name=job_id(args["name"]), agent=call.ctx.agent.id, input=args["action"],
                            issuer=await issuer_display(call), **{kind: timing})
    await store_schedule(call, schedule, "rune@cron-create")
    return {"created": True, "job_id": schedule.name, **schedule_view(schedule)}


async def _list(call: BuiltinCall) -> dict[str, Any]:
    mine = await trio.to_thread.run_sync(schedule_store(call).entries_of, call.ctx.issuer_pubkey, call.ctx.agent.id)
    jobs = [{"job_id": s.name, **schedule_view(s), "made_with": made_with} for s, made_with in mine]
    return {"jobs": jobs, "count": len(jobs)}


async def _cancel(call: BuiltinCall) -> dict[str, Any]:
    job = call.arguments["job_id"]
    cancelled = await trio.to_thread.run_sync(schedule_store(call).delete, job, call.ctx.issuer_pubkey, call.ctx.agent.id)
    answer: dict[str, Any] = {"cancelled": cancelled, "job_id": job}
    if not cancelled:
        answer["reason"] = "no job of that id that this agent made for this issuer (cron-list shows them)"
    return answer


TOOLS = (
    Builtin(
        name="rune@cron-create",
        description=("Create a recurring job that runs this agent with `action` as its input, on `schedule`: a "
                     "five-field cron line in UTC (\"0 9 * * 1-5\"), \"every 5 minutes\", \"every 2 hours\", "
                     "\"daily at 9am\", \"weekdays at 17:30\", \"hourly\". It acts for the issuer of this intent. "
                     "Answers its job_id."),
        parameters={"type": "object", "additionalProperties": False, "required": ["name", "schedule", "action"],
                    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 64},
                                   "schedule": {"type": "string", "minLength": 1, "maxLength": 128},
                                   "action": {"type": "string", "minLength": 1, "maxLength": 16384}}},
        run=_create,
    ),
    Builtin(name="rune@cron-list", description="The recurring jobs (and schedules) this agent made for this intent's issuer.",
            parameters=NO_ARGUMENTS, run=_list),
    Builtin(name="rune@cron-cancel", description="Cancel a recurring job this agent made for this intent's issuer, by job_id.",
            parameters={"type": "object", "additionalProperties": False, "required": ["job_id"],
                        "properties": {"job_id": {"type": "string", "pattern": SCHEDULE_NAME.pattern}}},
            run=_cancel),
)
