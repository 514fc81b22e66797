"""rune@shell-exec through a real daemon, replica and scripted model: the agent's uid, workspace and limits."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import KEY_VALUE, add_rune_agent, configure, outcome_of
from tests.rune.test_file_tools import tool_events, tool_results

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="shell-exec limits are checked with agents on their own uid")


def start(d: DaemonProcess, fake: FakeModelServer, extra: str = "") -> None:
    configure(d, ("fake", fake), extra=extra)
    add_rune_agent(d, toolset=("rune@shell-exec", "rune@file-write"), max_steps=8)
    d.start()
    d.cli("grant", "tester@test", "tool.shell_exec", "tool.file_write", check=True)


def dispatch(d: DaemonProcess, text: str = "run it") -> dict:
    result = d.cli("dispatch", text, "--agent", "chat@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["outcome"] == "ok", outcome
    return outcome


def replica_pid(d: DaemonProcess) -> int:
    (replica,) = d.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
    return int(replica["pid"])


def left_behind(uid: int, keep: int) -> list[psutil.Process]:
    """Processes of the agent uid other than its replica."""
    found = []
    for proc in psutil.process_iter(["uids", "pid"]):
        uids = proc.info.get("uids")
        if uids and uids.real == uid and proc.pid != keep:
            found.append(proc)
    return found


def wait_none_left(uid: int, keep: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while (left := left_behind(uid, keep)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [(p.pid, p.info) for p in left]


def test_runs_as_the_agent_in_its_workspace_with_only_the_agents_env(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    start(daemon, fake_model)
    assert daemon.process is not None
    daemon_pid = daemon.process.pid
    command = (
        "echo out; echo err >&2; pwd; id -u; env; "
        f"cat /proc/{daemon_pid}/environ; cat /proc/1/environ; tr '\\0' '\\n' < /proc/$PPID/environ; exit 3"
    )
    fake_model.script(Reply.tools(ToolCall("shell-exec", {"command": command})), Reply(text="done"))
    outcome = dispatch(daemon)
    (result,) = tool_results(fake_model, 1)
    workspace = daemon.home / "state" / "workspaces" / "chat@local"
    uid = workspace.stat().st_uid
    lines = result["stdout"].splitlines()
    assert result["exit_code"] == 3 and lines[0] == "out" and "err" in result["stderr"]
    assert lines[1] == str(workspace) and lines[2] == str(uid) and uid != 0
    env = dict(line.split("=", 1) for line in lines[3:] if "=" in line and line.split("=", 1)[0].isidentifier())
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin" and env["COVENANT_AGENT_ID"] == "chat@local"
    everything = json.dumps(result)
    assert KEY_VALUE not in everything, "the daemon's environment reached the command"
    assert "COVENANT_HOME" not in env and "FAKE_PROVIDER_KEY" not in everything
    (event,) = tool_events(daemon, outcome["intent_id"])
    assert event["outcome"] == "ok" and event["tool"] == "tool.shell_exec"
    assert daemon.stop() == 0


def test_timeout_memory_hog_and_fork_bomb_are_stopped(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    start(daemon, fake_model, extra="[tools.shell_exec]\ntimeout_ms = 4000\n")
    hog = "python3 -c \"import time\na=[]\nwhile True:\n a.append(b'x'*(32<<20)); time.sleep(0.02)\""
    fake_model.script(
        Reply.tools(
            ToolCall("shell-exec", {"command": "sleep 60", "timeout_ms": 1000}),
            ToolCall("shell-exec", {"command": "sleep 60"}),  # the configured 4 s default
            ToolCall("shell-exec", {"command": hog}),
        ),
        Reply(text="done"),
    )
    began = time.monotonic()
    outcome = dispatch(daemon)
    took = time.monotonic() - began
    short, default, memory = tool_results(fake_model, 1)
    assert short["error"]["code"] == "tool_timeout" and default["error"]["code"] == "tool_timeout", (short, default)
    assert memory["error"]["code"] == "tool_failed" and "memory_exceeded" in memory["error"]["message"], memory
    assert took < 55, "a 60 s sleep ran to its end"
    events = tool_events(daemon, outcome["intent_id"])
    assert sorted(e["error_code"] for e in events) == ["tool_failed", "tool_timeout", "tool_timeout"]  # in order of ending
    uid = (daemon.home / "state" / "workspaces" / "chat@local").stat().st_uid
    wait_none_left(uid, replica_pid(daemon))

    bomb = "bomb() { bomb | bomb & }; bomb"
    fake_model.script(Reply.tools(ToolCall("shell-exec", {"command": bomb, "timeout_ms": 3000})), Reply(text="survived"))
    outcome = dispatch(daemon, "bomb")
    (result,) = tool_results(fake_model, 3)
    assert "error" in result or result["exit_code"] is not None, result
    wait_none_left(uid, replica_pid(daemon))
    fake_model.script(Reply.tools(ToolCall("shell-exec", {"command": "echo still here"})), Reply(text="fine"))
    dispatch(daemon, "after")
    assert tool_results(fake_model, 5)[-1]["stdout"] == "still here\n"
    assert daemon.stop() == 0


def test_processes_a_command_leaves_running_are_killed_counted_and_audited(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    start(daemon, fake_model)
    # A sleep in a session of its own outlives the process group's kill and is found by its marker. The
    # command ends only once it is out of the group (its pid file written after setsid).
    command = "setsid sh -c 'echo $$ > left.pid; exec sleep 301' & while [ ! -s left.pid ]; do sleep 0.01; done; echo started"
    fake_model.script(Reply.tools(ToolCall("shell-exec", {"command": command})), Reply(text="done"))
    outcome = dispatch(daemon)
    (result,) = tool_results(fake_model, 1)
    assert result["stdout"] == "started\n" and result["exit_code"] == 0, result
    assert result["left_behind"] == 1, result
    (event,) = tool_events(daemon, outcome["intent_id"])
    assert event["outcome"] == "ok" and event["left_behind"] == 1, event
    uid = (daemon.home / "state" / "workspaces" / "chat@local").stat().st_uid
    assert not left_behind(uid, replica_pid(daemon)), "killed before the result went back to the model"
