"""Agents calling agents (agent tools, rune@agent-send): child intents under the root issuer's authority."""

from __future__ import annotations

import json

import psutil
import pytest

from covenant.client import RemoteError
from covenant.keys import load_private_key
from covenant.policy.signing import sign_intent

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import outcome_of
from tests.workflow.conftest import agent_tool, audit, configure, copy_multi_agent, record, rune_agent


def _tool_messages(request) -> list[dict]:  # type: ignore[no-untyped-def]
    return [m for m in request.messages if m["role"] == "tool"]


def test_the_router_calls_researcher_and_analyst_through_its_agent_tools(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("anthropic", fake_model))
    copy_multi_agent(daemon)
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(
        Reply.tools(ToolCall("researcher", {"input": "facts about tides"})),
        Reply(text="RESEARCH: tides are lunar."),
        Reply.tools(ToolCall("analyst", {"input": "analyse: tides are lunar"})),
        Reply(text="ANALYSIS: predictable."),
        Reply(text="Routed to both: predictable lunar tides."),
    )
    result = daemon.cli("dispatch", "tell me about tides", "--agent", "router@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["text"] == "Routed to both: predictable lunar tides.", outcome
    first, researcher, second, analyst, last = fake_model.requests
    assert first.tool_names == ["researcher", "analyst"]
    assert researcher.messages[-1] == {"role": "user", "content": "facts about tides"}  # the child's text is the input
    assert "RESEARCH: tides are lunar." in _tool_messages(second)[0]["content"]
    assert analyst.messages[-1]["content"] == "analyse: tides are lunar"
    assert "ANALYSIS: predictable." in _tool_messages(last)[-1]["content"]

    root = record(daemon, outcome["intent_id"])
    assert [(c["agent"], c["outcome"], c["via"]) for c in root["children"]] == [
        ("researcher@local", "ok", "tool"), ("analyst@local", "ok", "tool")]
    decisions = {r["data"]["intent"]: r["data"] for r in audit(daemon, "policy.decision")}
    for child in root["children"]:
        assert decisions[child["intent"]]["allowed"] is True and decisions[child["intent"]]["depth"] == 1
        assert record(daemon, child["intent"])["parent"] == outcome["intent_id"]
    tree = daemon.cli("show", outcome["intent_id"], check=True).stdout
    assert tree.index("researcher@local  ok") < tree.index("analyst@local  ok")
    assert daemon.stop() == 0


def test_a_call_across_networks_is_refused_and_audited(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    tool = agent_tool("ask_other", "other", timeout_ms=30000)
    rune_agent(daemon, "caller", toolset=("ask_other",), tools=tool, networks=("alpha",))
    rune_agent(daemon, "other", networks=("beta",))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(Reply.tools(ToolCall("ask_other", {"input": "hello other"})), Reply(text="could not reach it"))
    outcome = outcome_of(daemon.cli("dispatch", "go", "--agent", "caller@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    assert len(fake_model.requests) == 2  # the other agent's model was never asked
    error = json.loads(_tool_messages(fake_model.requests[1])[0]["content"])["error"]
    assert error["code"] == "agent_refused" and "network" in error["message"]
    (child,) = record(daemon, outcome["intent_id"])["children"]
    assert child["outcome"] == "network"
    decision = next(r["data"] for r in audit(daemon, "policy.decision") if r["data"]["intent"] == child["intent"])
    assert decision["allowed"] is False and decision["reason"] == "network" and decision["agent"] == "other@local"
    received = next(r["data"] for r in audit(daemon, "intent.received") if r["data"]["intent"] == child["intent"])
    assert received["parent"] == outcome["intent_id"] and received["signed_by"] == "daemon"
    call = next(r["data"] for r in audit(daemon, "tool.call") if r["data"]["intent"] == outcome["intent_id"])
    assert call["outcome"] == "denied"
    assert daemon.stop() == 0


def test_a_self_calling_agent_is_stopped_at_max_depth(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    tool = agent_tool("again", "loop", timeout_ms=60000, max_depth=3)
    rune_agent(daemon, "loop", toolset=("again",), tools=tool)
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.again", check=True)
    # Depths 0..3 each call again; the call from depth 3 would be depth 4 and is refused.
    fake_model.script(*[Reply.tools(ToolCall("again", {"input": f"level {n + 1}"})) for n in range(4)],
                      *[Reply(text=f"done {n}") for n in range(4)])
    outcome = outcome_of(daemon.cli("dispatch", "level 0", "--agent", "loop@local", "--json"))
    assert outcome["outcome"] == "ok" and outcome["text"] == "done 3", outcome
    refused = json.loads(_tool_messages(fake_model.requests[4])[0]["content"])["error"]
    assert refused["code"] == "agent_refused" and "max_depth" in refused["message"]
    depths = {r["data"]["intent"]: r["data"].get("depth") for r in audit(daemon, "policy.decision")}
    chain, intent = [], outcome["intent_id"]
    while True:
        children = record(daemon, intent)["children"]
        if not children or children[0]["outcome"] != "ok":
            break
        intent = children[0]["intent"]
        chain.append(depths[intent])
    assert chain == [1, 2, 3]
    assert children[0]["outcome"] == "max_depth" and depths[children[0]["intent"]] == 4
    tree = daemon.cli("show", outcome["intent_id"], check=True).stdout
    assert tree.count("loop@local  ok") == 3 and "loop@local  max_depth" in tree
    assert daemon.stop() == 0


def test_a_child_the_issuers_grants_do_not_cover_is_refused(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("anthropic", fake_model))
    copy_multi_agent(daemon)
    daemon.start()
    # Enough to run the router (its two agent tools), not the researcher's own tools.
    daemon.cli("grant", "tester@test", "tool.researcher", check=True)
    daemon.cli("grant", "tester@test", "tool.analyst", check=True)
    fake_model.script(Reply.tools(ToolCall("researcher", {"input": "look it up"})), Reply(text="the researcher was refused"))
    outcome = outcome_of(daemon.cli("dispatch", "look something up", "--agent", "router@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    assert len(fake_model.requests) == 2  # the researcher never ran, though the daemon signed its intent
    error = json.loads(_tool_messages(fake_model.requests[1])[0]["content"])["error"]
    assert error["code"] == "agent_refused" and "capability_denied" in error["message"]
    (child,) = record(daemon, outcome["intent_id"])["children"]
    assert child["outcome"] == "capability_denied" and child["agent"] == "researcher@local"
    decision = next(r["data"] for r in audit(daemon, "policy.decision") if r["data"]["intent"] == child["intent"])
    assert decision["allowed"] is False and "tool.web_fetch" in decision["missing"]
    assert not [p for p in psutil.process_iter(["cmdline"]) if child["intent"] in " ".join(p.info["cmdline"] or [])]
    assert daemon.stop() == 0


def test_a_child_intent_sent_to_the_control_socket_is_rejected(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    """A daemon-signed child carries the root issuer but the daemon's signature: the socket refuses it."""
    configure(daemon, ("fake", fake_model))
    rune_agent(daemon, "quiet")
    daemon.start()
    fake_model.script(Reply(text="hello"))
    outcome = outcome_of(daemon.cli("dispatch", "hi", "--agent", "quiet@local", "--json"))
    received = next(r["data"] for r in audit(daemon, "intent.received") if r["data"]["intent"] == outcome["intent_id"])
    forged = {
        "intent": {"id": "child-forged1", "text": "hi", "agent": "quiet@local",
                   "issuer": {"display": "tester@test", "pubkey": received["issuer"]},
                   "issued_at": received["issued_at"], "priority": "normal", "parent": outcome["intent_id"]},
    }
    # Even the daemon's own signature does not make it pass: the socket checks the issuer's key.
    forged["signature"] = sign_intent(load_private_key(daemon.home / "identity" / "daemon.key"), forged["intent"])
    with pytest.raises(RemoteError) as refused:
        daemon.api("POST", "/v1/dispatch", forged)
    assert refused.value.code == "bad_signature"
    assert len(fake_model.requests) == 1
    assert daemon.stop() == 0


def test_agent_send_reaches_a_peer_and_agent_list_shows_only_peers(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    rune_agent(daemon, "asker", toolset=("rune@agent-list", "rune@agent-send"), networks=("team",))
    rune_agent(daemon, "helper", networks=("team", "bridge"))
    rune_agent(daemon, "stranger", networks=("elsewhere",))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(
        Reply.tools(ToolCall("agent-list", {})),
        Reply.tools(ToolCall("agent-send", {"agent": "helper", "input": "help me"})),
        Reply(text="helped"),
        Reply.tools(ToolCall("agent-send", {"agent": "stranger", "input": "and you?"})),
        Reply(text="done"),
    )
    outcome = outcome_of(daemon.cli("dispatch", "start", "--agent", "asker@local", "--json"))
    assert outcome["outcome"] == "ok" and outcome["text"] == "done", outcome
    listed = json.loads(_tool_messages(fake_model.requests[1])[0]["content"])
    assert {a["agent"] for a in listed["agents"]} == {"asker@local", "helper@local"}
    assert fake_model.requests[2].messages[-1]["content"] == "help me"
    sent = json.loads(_tool_messages(fake_model.requests[3])[1]["content"])
    assert sent["agent"] == "helper@local" and sent["text"] == "helped"
    refused = json.loads(_tool_messages(fake_model.requests[4])[2]["content"])["error"]
    assert refused["code"] == "agent_refused" and "network" in refused["message"]
    assert [c["outcome"] for c in record(daemon, outcome["intent_id"])["children"]] == ["ok", "network"]
    assert daemon.stop() == 0


def test_the_callers_remaining_time_bounds_the_callee(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    tool = agent_tool("slow_friend", "friend", timeout_ms=600000)
    rune_agent(daemon, "hurried", toolset=("slow_friend",), tools=tool, timeout_ms=4000)
    rune_agent(daemon, "friend", timeout_ms=600_000)
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(Reply.tools(ToolCall("slow_friend", {"input": "take your time"})), Reply(text="late", delay_s=30))
    result = daemon.cli("dispatch", "quick", "--agent", "hurried@local", "--json")
    outcome = outcome_of(result)
    assert outcome["outcome"] == "timeout", outcome
    (child,) = record(daemon, outcome["intent_id"])["children"]  # the caller's record waited for it to end
    child_record = record(daemon, child["intent"])
    # It ended by its caller's deadline: timed out itself, or stopped as its caller ended.
    assert child_record["outcome"] in ("timeout", "cancelled") and child_record["duration_ms"] < 10_000, child_record
    assert child["outcome"] == child_record["outcome"]
    assert daemon.stop() == 0
