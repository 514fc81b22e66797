"""rune@agent-spawn and rune@agent-kill in a real daemon: a Rune agent makes a helper from Runefile text,
talks to it, kills it; tools beyond the spawner's are refused; the helper is its spawner's alone; it
expires at [rune] spawned_ttl_s and never outlives the daemon."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil

from tests.daemon.conftest import DaemonProcess
from tests.daemon.test_daemon_e2e import wait_for
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import outcome_of
from tests.workflow.conftest import audit, configure, rune_agent
from tests.processes import alive

HELPER = """name: helper
version: 0.1.0
instructions: You help your spawner.
default_model: default
toolset: ["rune@system-time"]
models:
  providers: ["fake"]
  model_mapping:
    default: fake-model
"""
GREEDY = HELPER.replace('["rune@system-time"]', '["rune@system-time", "rune@shell-exec"]').replace("helper", "greedy")


def helper_id(d: DaemonProcess, name: str = "helper") -> str:
    """``NAME@spawned-<first 12 hex of the issuer's key>``: the id the test issuer's spawned agent gets."""
    pubkey = json.loads(d.cli("identity", "show", "--json", check=True).stdout)["pubkey"]
    return f"{name}@spawned-{pubkey[:12]}"


def _boss(d: DaemonProcess, text: str) -> dict:
    return outcome_of(d.cli("dispatch", text, "--agent", "boss@local", "--json"))


def _spawned(d: DaemonProcess) -> list[dict]:
    return d.api("GET", "/v1/agents")["spawned"]  # type: ignore[index]


def _helper_pid(d: DaemonProcess) -> int | None:
    replicas = d.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
    return next((r["pid"] for r in replicas if r["agent"] == helper_id(d) and r["pid"]), None)


def test_spawn_talk_kill_and_expire(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    rune_agent(daemon, "boss", toolset=("rune@agent-spawn", "rune@agent-kill", "rune@agent-send", "rune@system-time"))
    agents_before = sorted(p.name for p in (daemon.home / "agents").iterdir())
    daemon.start()
    helper = helper_id(daemon)

    # The spawner needs agent.spawn: without it the dispatch itself is denied.
    denied = daemon.cli("dispatch", "make a helper", "--agent", "boss@local", "--json")
    assert denied.returncode == 3 and "agent.spawn" in denied.stdout + denied.stderr
    daemon.cli("grant", "tester@test", "agent.spawn", "tool.*", check=True)

    fake_model.script(Reply.tools(ToolCall("agent-spawn", {"manifest": HELPER})),
                      Reply.tools(ToolCall("agent-spawn", {"manifest": GREEDY})), Reply(text="spawned"))
    assert _boss(daemon, "make a helper")["outcome"] == "ok"
    results = [m["content"] for r in fake_model.requests[-2:] for m in r.messages[-1:]]
    assert helper in results[0]
    assert "spawn_refused" in results[1] and "rune@shell-exec" in results[1]  # more than the spawner has
    (entry,) = _spawned(daemon)
    assert (entry["agent"], entry["spawner"], entry["issuer"]) == (helper, "boss@local", "tester@test")
    assert sorted(p.name for p in (daemon.home / "agents").iterdir()) == agents_before  # never written there
    listed = daemon.cli("agents", "list", check=True).stdout
    assert f"{helper}: spawned by boss@local for tester@test, expires" in listed

    # Only its spawner reaches it: a person's dispatch does not.
    direct = daemon.cli("dispatch", "hello", "--agent", helper, "--json")
    assert direct.returncode == 6

    fake_model.script(Reply.tools(ToolCall("agent-send", {"agent": helper, "input": "what time?"})),
                      Reply(text="It is tea time."), Reply(text="the helper says tea"))
    talk = _boss(daemon, "ask the helper")
    assert talk["outcome"] == "ok" and talk["text"] == "the helper says tea"
    helper_messages = fake_model.requests[-2].messages
    assert helper_messages[0]["content"].startswith("You help your spawner.")
    pid = _helper_pid(daemon)
    assert pid is not None and psutil.pid_exists(pid)

    groups = daemon.api("GET", "/v1/status")["cpu_share"]["parent"]  # type: ignore[index]
    if groups is not None:  # a host with a writable CPU controller: the helper runs in a group of its own
        assert (Path(groups) / helper).is_dir() and (Path(groups) / "boss@local").is_dir()

    fake_model.script(Reply.tools(ToolCall("agent-kill", {"agent_id": "helper"})), Reply(text="gone"))
    assert _boss(daemon, "kill the helper")["outcome"] == "ok"
    assert _spawned(daemon) == []
    wait_for(lambda: not alive(pid),
             timeout=30, what="the helper's replica to end")
    if groups is not None:  # its CPU group goes with it, its spawner's stays
        wait_for(lambda: not (Path(groups) / helper).exists(), timeout=30, what="the helper's CPU group to go")
        assert (Path(groups) / "boss@local").is_dir()
    kinds = [(r["type"], r["data"].get("reason")) for r in audit(daemon, "agent.spawn", "agent.kill")]
    assert kinds == [("agent.spawn", None), ("agent.kill", "killed")]

    # A daemon stop takes spawned agents with it; a restart starts with none.
    fake_model.script(Reply.tools(ToolCall("agent-spawn", {"manifest": HELPER})),
                      Reply.tools(ToolCall("agent-send", {"agent": helper, "input": "still there?"})),
                      Reply(text="yes"), Reply(text="again"))
    assert _boss(daemon, "make one more and ask it")["outcome"] == "ok"
    pid = _helper_pid(daemon)
    assert pid is not None
    assert daemon.stop() == 0
    assert not alive(pid)
    daemon.start()
    assert _spawned(daemon) == []
    assert not (daemon.home / "state" / "spawned" / helper).exists()
    assert daemon.stop() == 0


def test_a_spawned_agent_expires_at_its_ttl(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model), extra="[rune]\nspawned_ttl_s = 2\n")
    rune_agent(daemon, "boss", toolset=("rune@agent-spawn", "rune@system-time"))
    daemon.start()
    daemon.cli("grant", "tester@test", "agent.spawn", "tool.*", check=True)
    fake_model.script(Reply.tools(ToolCall("agent-spawn", {"manifest": HELPER})), Reply(text="spawned"))
    assert _boss(daemon, "make a helper")["outcome"] == "ok"
    started = time.monotonic()
    wait_for(lambda: _spawned(daemon) == [], timeout=60, what="the spawned agent to expire")
    assert time.monotonic() - started < 60
    expired = [r["data"] for r in audit(daemon, "agent.kill")]
    assert [e["reason"] for e in expired] == ["expired"] and expired[0]["agent"] == helper_id(daemon)
    assert daemon.stop() == 0
