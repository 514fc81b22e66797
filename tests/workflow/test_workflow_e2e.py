"""Workflows end to end: a real daemon, real replicas, the scripted fake model provider."""

from __future__ import annotations

import json

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply
from tests.rune.conftest import outcome_of
from tests.workflow.conftest import audit, configure, copy_multi_agent, record, rune_agent

WORKFLOW = "research-and-analyse@local"


def test_the_corpus_multi_agent_workflow_runs_researcher_then_analyst(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("anthropic", fake_model))
    copy_multi_agent(daemon)
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)

    plan = outcome_of(daemon.cli("dispatch", "tidal power", "--agent", WORKFLOW, "--dry-run", "--json"))
    waves = plan["workflow"]["waves"]
    assert [[s["step"] for s in wave] for wave in waves] == [["researcher"], ["analyst"]]
    assert waves[0][0]["agent"] == "researcher@local" and "tool.web_fetch" in waves[0][0]["capabilities"]
    assert not fake_model.requests  # a dry run calls no model

    fake_model.script(Reply(text="FINDINGS: tides move 2 TW."), Reply(text="SUMMARY: tides are steady."))
    result = daemon.cli("dispatch", "tidal power", "--agent", WORKFLOW, "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["outcome"] == "ok", outcome
    assert outcome["text"] == "SUMMARY: tides are steady."  # output_step: the analyst's answer
    researcher_request, analyst_request = fake_model.requests
    assert researcher_request.messages[-1]["content"] == "Research the following and return raw findings: tidal power"
    assert "FINDINGS: tides move 2 TW." in analyst_request.messages[-1]["content"]  # the analyst's input holds it

    root = record(daemon, outcome["intent_id"])
    assert root["parent"] is None and root["runtime"] == "workflow"
    assert [(c["step"], c["agent"], c["outcome"]) for c in root["children"]] == [
        ("researcher", "researcher@local", "ok"), ("analyst", "analyst@local", "ok")]
    for child in root["children"]:
        assert record(daemon, child["intent"])["parent"] == outcome["intent_id"]
    received = [r["data"] for r in audit(daemon, "intent.received") if r["data"].get("parent") == outcome["intent_id"]]
    assert len(received) == 2 and all(r["signed_by"] == "daemon" and r["depth"] == 1 for r in received)
    assert all(r["issuer"] == received[0]["issuer"] for r in received)  # the root issuer, not the daemon
    history = json.loads(daemon.cli("history", "--json", check=True).stdout)
    assert {h["intent_id"]: h["parent"] for h in history if h.get("parent")} == {
        c["intent"]: outcome["intent_id"] for c in root["children"]}
    tree = daemon.cli("show", outcome["intent_id"], check=True).stdout
    assert "researcher@local" in tree and "analyst@local" in tree and "step researcher" in tree
    assert daemon.stop() == 0
