"""Tools end to end: a real daemon and replica, the scripted fake model, the real audit log."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat

from covenant.canonical import canonical_bytes
from tests.conftest import rune_examples
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of


def _install_copy(daemon: DaemonProcess, source: str) -> None:
    target = daemon.home / "agents" / "sentiment-agent"
    shutil.copytree(rune_examples() / source, target)
    for folder, dirs, files in os.walk(target):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


def _audit_bytes(daemon: DaemonProcess) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((daemon.home / "audit").rglob("*")) if p.is_file())


def _tool_events(daemon: DaemonProcess, intent: str) -> list[dict]:
    records = [json.loads(line) for line in daemon.cli("audit", "tail", "--json", "-n", "1000000", check=True).stdout.splitlines()]
    return [r["data"] for r in records if r["type"] == "tool.call" and r["data"]["intent"] == intent]


def test_the_corpus_sentiment_agent_runs_its_real_python_tool(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    _install_copy(daemon, "custom-tool-python")
    configure(daemon, ("openai", fake_model))  # the package lists anthropic first: not configured, skipped
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.analyse_sentiment", check=True)
    texts = ["I love this, it is great", "This is terrible and awful"]
    fake_model.script(
        Reply.tools(ToolCall("analyse_sentiment", {"texts": texts})),
        Reply.tools(ToolCall("analyse_sentiment", '{"texts": ["broken')),
        Reply(text="One positive, one negative."),
    )
    result = daemon.cli("dispatch", "how do these feel?", "--agent", "sentiment-agent@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["outcome"] == "ok", outcome
    assert outcome["text"] == "One positive, one negative."
    first, second, third = fake_model.requests
    assert first.tool_names == ["analyse_sentiment"]
    answered = json.loads([m for m in second.messages if m["role"] == "tool"][-1]["content"])
    assert [r["sentiment"] for r in answered["results"]] == ["positive", "negative"]
    refused = json.loads([m for m in third.messages if m["role"] == "tool"][-1]["content"])
    assert refused["error"]["code"] == "invalid_arguments"
    events = _tool_events(daemon, outcome["intent_id"])
    assert [(e["name"], e["tool"], e["outcome"]) for e in events] == [
        ("analyse_sentiment", "tool.analyse_sentiment", "ok"),
        ("analyse_sentiment", "tool.analyse_sentiment", "error"),
    ]
    assert events[0]["args_sha256"] == hashlib.sha256(canonical_bytes({"texts": texts})).hexdigest()
    assert b"I love this" not in _audit_bytes(daemon)  # arguments never in the log
    assert daemon.stop() == 0


def test_memory_survives_a_daemon_restart_and_stays_the_daemons(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, "keeper", toolset=("rune@memory-store", "rune@memory-recall"))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.memory_store", "tool.memory_recall", check=True)
    fake_model.script(Reply.tools(ToolCall("memory-store", {"key": "colour", "value": "teal"})), Reply(text="Noted."))
    first = outcome_of(daemon.cli("dispatch", "remember teal", "--agent", "keeper@local", "--json"))
    assert first["outcome"] == "ok", first
    assert daemon.stop() == 0
    path = daemon.home / "state" / "memory" / "keeper@local" / "memory.jsonl"
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()

    daemon.start()
    fake_model.script(Reply.tools(ToolCall("memory-recall", {"key": "colour"})), Reply(text="Teal."))
    second = outcome_of(daemon.cli("dispatch", "what colour?", "--agent", "keeper@local", "--json"))
    assert second["outcome"] == "ok", second
    recalled = json.loads([m for m in fake_model.requests[-1].messages if m["role"] == "tool"][-1]["content"])
    assert recalled["found"] is True and recalled["value"] == "teal"
    assert [e["outcome"] for e in _tool_events(daemon, second["intent_id"])] == ["ok"]
    assert b"teal" not in _audit_bytes(daemon)
    assert daemon.stop() == 0
