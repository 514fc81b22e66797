"""rune@schedule-create|list|delete through the real tool host: bound to the issuer, gated by tool.schedule_*."""

from __future__ import annotations

from covenant.triggers.agent_schedules import AgentScheduleStore, agent_schedules_path
from tests.tools.conftest import Tools, tools  # noqa: F401  (the real tool host fixture)

TOOLS = ["rune@schedule-create", "rune@schedule-list", "rune@schedule-delete"]
ACTIONS = ("tool.schedule_create", "tool.schedule_list", "tool.schedule_delete")


async def test_create_list_delete_bound_to_the_issuer(tools: Tools) -> None:
    agent = tools.package("planner", TOOLS)
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    made = await tools.host.call(ctx, "schedule-create", {"name": "nightly", "cron": "0 2 * * *", "input": "tidy"})
    assert made.ok, made
    assert made.content == {"created": True, "schedule_id": "nightly", "id": "nightly", "name": "nightly", "agent": agent.id, "input": "tidy",
                            "every": None, "cron": "0 2 * * *"}
    again = await tools.host.call(ctx, "schedule-create", {"name": "nightly", "every": "5s"})
    assert (again.ok, again.error_code) == (False, "tool_failed") and "exists already" in again.error_message
    bad = await tools.host.call(ctx, "schedule-create", {"name": "both", "every": "5s", "cron": "* * * * *"})
    assert (bad.ok, bad.error_code) == (False, "invalid_arguments") and "exactly one" in bad.error_message
    listed = await tools.host.call(ctx, "schedule-list", {})
    assert [s["name"] for s in listed.content["schedules"]] == ["nightly"]

    stored = AgentScheduleStore(agent_schedules_path(tools.home.state_dir)).schedules()
    assert [(s.name, s.agent, pubkey) for s, pubkey in stored] == [("nightly", agent.id, tools.issuer_pub)]

    other = tools.ctx(agent, tools.grant(*ACTIONS))
    other = type(other)(**{**other.__dict__, "issuer_pubkey": "ab" * 32})
    assert (await tools.host.call(other, "schedule-delete", {"name": "nightly"})).ok is False  # no grant for them
    tools.store.add(tools.daemon_key, "ab" * 32, list(ACTIONS), None, None)
    other = type(other)(**{**other.__dict__, "grants": tools.store.load()})
    theirs = await tools.host.call(other, "schedule-delete", {"name": "nightly"})
    assert theirs.content == {"deleted": False, "name": "nightly"}  # granted, but not their schedule
    assert (await tools.host.call(other, "schedule-list", {})).content["count"] == 0

    gone = await tools.host.call(ctx, "schedule-delete", {"name": "nightly"})
    assert gone.content == {"deleted": True, "name": "nightly"}
    assert (await tools.host.call(ctx, "schedule-list", {})).content == {"schedules": [], "count": 0}


async def test_without_tool_schedule_create_the_tool_refuses(tools: Tools) -> None:
    agent = tools.package("planner", TOOLS)
    ctx = tools.ctx(agent, tools.grant("tool.schedule_list"))
    refused = await tools.host.call(ctx, "schedule-create", {"name": "x", "every": "5s"})
    assert (refused.ok, refused.error_code) == (False, "capability_denied")
    assert "tool.schedule_create" in refused.error_message
    assert AgentScheduleStore(agent_schedules_path(tools.home.state_dir)).schedules() == []
    assert [e["outcome"] for e in tools.audit.of("tool.call")] == ["denied"]
