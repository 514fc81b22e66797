"""rune@cron-create|list|cancel through the real tool host: the reference's shape, the schedules' store,
each job this agent's own for this issuer."""

from __future__ import annotations

from covenant.triggers.agent_schedules import AgentScheduleStore, agent_schedules_path
from tests.tools.conftest import Tools, tools  # noqa: F401  (the real tool host fixture)

TOOLS = ["rune@cron-create", "rune@cron-list", "rune@cron-cancel", "rune@schedule-create"]
ACTIONS = ("tool.cron_create", "tool.cron_list", "tool.cron_cancel", "tool.schedule_create")


async def test_cron_jobs_live_in_the_schedules_store_and_only_their_agent_cancels_them(tools: Tools) -> None:
    agent = tools.package("reporter", TOOLS)
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    made = await tools.host.call(ctx, "cron-create", {"name": "Daily report", "schedule": "weekdays at 9am",
                                                       "action": "Summarise yesterday's tickets"})
    assert made.ok, made
    assert made.content["job_id"] == "Daily-report" and made.content["cron"] == "0 9 * * 1-5"
    every = await tools.host.call(ctx, "cron-create", {"name": "tick", "schedule": "every 5 minutes", "action": "tick"})
    assert every.ok and every.content["every"] == "5m", every
    plain = await tools.host.call(ctx, "schedule-create", {"name": "plain", "every": "1h"})
    assert plain.ok, plain

    # One store with schedule-create's: the daemon's runner (and `covenant schedules`) reads it.
    stored = {s.name: (s.agent, s.input, pubkey) for s, pubkey in
              AgentScheduleStore(agent_schedules_path(tools.home.state_dir)).schedules()}
    assert stored["Daily-report"] == (agent.id, "Summarise yesterday's tickets", tools.issuer_pub)
    assert set(stored) == {"Daily-report", "tick", "plain"}
    listed = await tools.host.call(ctx, "cron-list", {})
    assert {(j["job_id"], j["made_with"]) for j in listed.content["jobs"]} == {
        ("Daily-report", "rune@cron-create"), ("tick", "rune@cron-create"), ("plain", "rune@schedule-create")}

    # Bad shapes are the model's to fix; nothing is stored.
    for args, words in (({"name": "x", "schedule": "whenever", "action": "a"}, "cannot read the schedule"),
                        ({"name": "x", "schedule": "61 * * * *", "action": "a"}, "cron"),
                        ({"name": "tick", "schedule": "hourly", "action": "a"}, "exists already")):
        bad = await tools.host.call(ctx, "cron-create", args)
        assert not bad.ok and words in bad.error_message, bad
    odd = await tools.host.call(ctx, "cron-cancel", {"job_id": "../../etc"})
    assert (odd.ok, odd.error_code) == (False, "invalid_arguments")

    # Another agent of the same issuer neither sees nor cancels this agent's jobs.
    other_agent = tools.package("intruder", TOOLS)
    other = tools.ctx(other_agent, tools.store.load())
    assert (await tools.host.call(other, "cron-list", {})).content == {"jobs": [], "count": 0}
    refused = await tools.host.call(other, "cron-cancel", {"job_id": "tick"})
    assert refused.ok and refused.content["cancelled"] is False and "this agent made" in refused.content["reason"]
    # Nor does another issuer, granted or not.
    tools.store.add(tools.daemon_key, "ab" * 32, list(ACTIONS), None, None)
    stranger = type(ctx)(**{**ctx.__dict__, "issuer_pubkey": "ab" * 32, "grants": tools.store.load()})
    assert (await tools.host.call(stranger, "cron-cancel", {"job_id": "tick"})).content["cancelled"] is False

    gone = await tools.host.call(ctx, "cron-cancel", {"job_id": "tick"})
    assert gone.content == {"cancelled": True, "job_id": "tick"}
    left = {s.name for s, _ in AgentScheduleStore(agent_schedules_path(tools.home.state_dir)).schedules()}
    assert left == {"Daily-report", "plain"}
    outcomes = [e["outcome"] for e in tools.audit.of("tool.call")]
    assert outcomes.count("ok") >= 8 and "denied" not in outcomes


async def test_without_tool_cron_create_nothing_is_stored(tools: Tools) -> None:
    agent = tools.package("reporter", TOOLS)
    refused = await tools.host.call(tools.ctx(agent, tools.grant("tool.cron_list")), "cron-create",
                                    {"name": "x", "schedule": "hourly", "action": "a"})
    assert (refused.ok, refused.error_code) == (False, "capability_denied") and "tool.cron_create" in refused.error_message
    assert AgentScheduleStore(agent_schedules_path(tools.home.state_dir)).schedules() == []
