"""Agents calling remote A2A agents by URL: workflow steps and rune@a2a-send, through the daemon only.

The remote parties are real processes on loopback: the official SDK's server with an echo agent
(A2A 1.0, bearer-checked) and a raftio-style 0.3 endpoint without a card."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.a2a.conftest import free_port
from tests.daemon.conftest import DaemonProcess, agent_processes
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import outcome_of
from tests.workflow.conftest import audit, configure, rune_agent

REPO = Path(__file__).resolve().parents[2]
REMOTE_TOKEN = "remote-bearer-0123456789"


class Remote:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen([sys.executable, "-m", "tests.fakes.a2a_remote", "--port", str(self.port), *args],
                                        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            assert self.process.poll() is None, "the remote agent process exited"
            time.sleep(0.05)
        raise AssertionError("the remote agent did not listen")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/a2a/echo"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def remotes() -> Iterator[dict[str, Remote]]:
    started = {"sdk": Remote("--mode", "sdk", "--token", REMOTE_TOKEN), "legacy": Remote("--mode", "legacy"),
               "big": Remote("--mode", "legacy", "--big")}
    yield started
    for remote in started.values():
        remote.stop()


def _workflow(d: DaemonProcess, name: str, url: str, *, text: str = "{{ input }}", timeout_ms: int = 30_000) -> None:
    root = d.home / "agents" / name
    root.mkdir(parents=True)
    (root / "workflow.yaml").write_text(textwrap.dedent(f"""\
        name: {name}
        version: 0.1.0
        timeout_ms: 60000
        output_step: far
        steps:
          - id: far
            agent_ref: {url}
            input_template: "{text}"
            timeout_ms: {timeout_ms}
        """))


def _dispatch(d: DaemonProcess, agent: str, text: str) -> dict:
    return outcome_of(d.cli("dispatch", text, "--agent", agent, "--json"))


def test_workflow_steps_and_rune_agents_call_remote_agents_only_under_remotes(
        daemon: DaemonProcess, fake_model: FakeModelServer, remotes: dict[str, Remote]) -> None:
    sdk, legacy, big = remotes["sdk"], remotes["legacy"], remotes["big"]
    outside = f"http://127.0.0.1:{free_port()}/a2a/echo"
    configure(daemon, ("fake", fake_model), extra=textwrap.dedent(f"""\
        [a2a]
        remotes = ["{sdk.url}", "{legacy.url}", "{big.url}"]
        max_answer_kb = 64
        [a2a.remote_tokens]
        "http://127.0.0.1:{sdk.port}/a2a" = "REMOTE_TOKEN"
        """))
    daemon.env["REMOTE_TOKEN"] = REMOTE_TOKEN
    _workflow(daemon, "far", sdk.url)
    _workflow(daemon, "outside", outside)
    _workflow(daemon, "legacy", legacy.url)
    _workflow(daemon, "big", big.url)
    _workflow(daemon, "hang", sdk.url, text="hang", timeout_ms=3000)
    rune_agent(daemon, "caller", toolset=("rune@a2a-send", "rune@a2a-discover"))
    daemon.start()

    # A remote step needs agent.remote in the issuer's grants (audited refusal).
    denied = _dispatch(daemon, "far@local", "hello")["error"]  # refused before the step: a workflow_denied
    assert denied["code"] == "workflow_denied" and denied["steps"][0]["reason"] == "capability_denied", denied
    assert denied["missing"] == ["agent.remote"]
    daemon.cli("grant", "tester@test", "agent.remote", "tool.a2a_send", "tool.a2a_discover", check=True)

    answer = _dispatch(daemon, "far@local", "hello")
    assert answer["outcome"] == "ok", answer
    assert answer["text"] == "echo: hello (auth=yes)"  # the bearer of [a2a.remote_tokens] reached it

    refused = _dispatch(daemon, "outside@local", "hello")["error"]
    assert refused["code"] == "workflow_denied" and refused["steps"][0]["reason"] == "remote", refused

    old = _dispatch(daemon, "legacy@local", "hi there")
    assert old["outcome"] == "ok" and old["text"] == "legacy echo: hi there"  # 0.3, no card

    too_big = _dispatch(daemon, "big@local", "x")
    assert too_big["outcome"] != "ok" and "remote_too_large" in str(too_big)

    started = time.monotonic()
    hung = _dispatch(daemon, "hang@local", "x")
    assert hung["outcome"] != "ok" and "timeout" in str(hung)
    assert time.monotonic() - started < 50  # cut at the step's 3 s deadline, not the remote's hour

    fake_model.script(Reply.tools(ToolCall("a2a-discover", {"url": sdk.url})),
                      Reply.tools(ToolCall("a2a-send", {"agent_url": sdk.url, "message": "from a rune agent"})),
                      Reply.tools(ToolCall("a2a-send", {"agent_url": outside, "message": "nope"})),
                      Reply(text="done"))
    result = _dispatch(daemon, "caller@local", "ask the remote")
    assert result["outcome"] == "ok", result
    tool_results = [m["content"] for r in fake_model.requests[-3:] for m in r.messages[-1:] if m["role"] == "tool"]
    assert "remote-echo" in tool_results[0]  # the card's name
    assert "echo: from a rune agent (auth=yes)" in tool_results[1]
    assert "agent_refused" in tool_results[2] and "remotes" in tool_results[2]
    assert daemon.stop() == 0
    assert not agent_processes(daemon.home)

    calls = [r["data"] for r in audit(daemon, "a2a.call")]
    assert [c["outcome"] for c in calls if c["via"] == "workflow"] == ["ok", "ok", "remote_too_large", "timeout"]
    assert [c["outcome"] for c in calls if c["via"] in ("tool", "discover")] == ["ok", "ok"]
    assert all(REMOTE_TOKEN not in str(c) for c in calls)
    # The two steps were refused before they ran (the workflow's decision names them), the tool's call as it was made.
    decisions = [r["data"] for r in audit(daemon, "policy.decision") if r["data"].get("url")]
    assert [(d["reason"], d["url"]) for d in decisions] == [("remote", outside)]
    workflows = [r["data"] for r in audit(daemon, "policy.decision") if r["data"].get("reason") == "workflow_denied"]
    assert [(w["agent"], w["steps"][0]["reason"], w["steps"][0]["agent"]) for w in workflows] == [
        ("far@local", "capability_denied", sdk.url), ("outside@local", "remote", outside)]
