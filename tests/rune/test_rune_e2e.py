"""Rune agents end to end: a real daemon, real replicas, the scripted fake model provider."""

from __future__ import annotations

import json

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import KEY_VALUE, add_rune_agent, configure, outcome_of


def test_a_dispatch_with_a_tool_round_trip(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon)
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.system_time", check=True)
    fake_model.script(Reply.tools(ToolCall("system-time", {})), Reply(text="It is late."))
    result = daemon.cli("dispatch", "what time is it?", "--agent", "chat@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0, outcome
    assert outcome["outcome"] == "ok" and outcome["text"] == "It is late."
    assert outcome["session_id"] and outcome["usage"]["model_calls"] == 2 and outcome["usage"]["tool_calls"] == 1
    first, second = fake_model.requests
    assert first.headers["authorization"] == f"Bearer {KEY_VALUE}"  # the daemon adds the key
    assert first.tool_names == ["system-time"]
    assert first.messages[0]["role"] == "system" and "covenant test agent" in first.messages[0]["content"]
    tool_message = next(m for m in second.messages if m["role"] == "tool")
    assert "utc" in tool_message["content"] or "iso" in tool_message["content"] or tool_message["content"]
    records = [json.loads(line) for line in daemon.cli("audit", "tail", "--json", check=True).stdout.splitlines()]
    types = [r["type"] for r in records if r.get("data", {}).get("intent") == outcome["intent_id"]]
    assert types.count("model.call") == 2 and types.count("tool.call") == 1
    assert types[-1] == "intent.completed"
    status = daemon.api("GET", "/v1/status")
    (replica,) = status["replicas"]  # type: ignore[index]
    assert replica["agent"] == "chat@local" and replica["state"] == "ready" and replica["pid"]
    assert daemon.stop() == 0
