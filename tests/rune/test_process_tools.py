"""rune@process-*: supervised processes of a Rune agent, through a real daemon, replica and scripted model."""

from __future__ import annotations

import os

import pytest

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of
from tests.rune.test_file_tools import tool_events, tool_results
from tests.rune.test_shell_exec import left_behind, wait_none_left

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the processes are found by the agent's own uid")

PROCESS_TOOLS = ("rune@process-start", "rune@process-poll", "rune@process-write", "rune@process-kill", "rune@process-list")


def test_start_write_poll_kill_and_everything_dies_with_the_intent(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model), extra="[tools.process]\nmax_per_agent = 3\n")
    add_rune_agent(daemon, toolset=PROCESS_TOOLS, max_steps=12)
    daemon.start()
    daemon.cli("grant", "tester@test", *[f"tool.{t.removeprefix('rune@').replace('-', '_')}" for t in PROCESS_TOOLS], check=True)
    fake_model.script(  # one call per reply where the order matters: calls of one reply run concurrently
        Reply.tools(ToolCall("process-start", {"command": "echo ready; read line; echo got $line; echo bye >&2"})),
        Reply.tools(ToolCall("process-start", {"command": "sleep 300"})),
        Reply.tools(ToolCall("process-start", {"command": "sh -c 'sleep 301 & sleep 302'"})),
        Reply.tools(ToolCall("process-start", {"command": "echo one too many"}),
                    ToolCall("process-write", {"id": "p-1", "data": "hello\n", "close": True})),
        Reply.tools(ToolCall("process-poll", {"id": "p-1", "wait_ms": 30000})),
        Reply.tools(ToolCall("process-list", {})),
        Reply.tools(ToolCall("process-kill", {"id": "p-2"})),
        Reply.tools(ToolCall("process-poll", {"id": "p-2"}), ToolCall("process-write", {"id": "p-9", "data": "x"})),
        Reply(text="p-3 is left running"),
    )
    result = daemon.cli("dispatch", "juggle", "--agent", "chat@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["outcome"] == "ok", outcome
    started = [tool_results(fake_model, i)[-1] for i in (1, 2, 3)]
    assert [s["id"] for s in started] == ["p-1", "p-2", "p-3"] and all(s["running"] for s in started), started
    too_many, written = tool_results(fake_model, 4)[-2:]
    assert too_many["error"]["code"] == "process_limit"
    assert written == {"id": "p-1", "written": 6, "closed": True}
    polled = tool_results(fake_model, 5)[-1]
    assert polled["running"] is False and polled["outcome"] == "exited" and polled["exit_code"] == 0, polled
    assert polled["stdout"] == "ready\ngot hello\n" and polled["stderr"] == "bye\n"
    listed = tool_results(fake_model, 6)[-1]
    assert [p["id"] for p in listed["processes"]] == ["p-2", "p-3"]  # p-1 was polled to its end and forgotten
    killed = tool_results(fake_model, 7)[-1]
    assert killed["running"] is False and killed["outcome"] == "cancelled"
    gone, unknown = tool_results(fake_model, 8)[-2:]
    assert gone["error"]["code"] == "process_not_found" and unknown["error"]["code"] == "process_not_found"
    events = tool_events(daemon, outcome["intent_id"])
    assert len(events) == 10 and {e["tool"] for e in events} >= {"tool.process_start", "tool.process_kill"}

    # p-3 (a shell with two sleeps) was still running when the intent ended: it and its children are gone.
    uid = (daemon.home / "state" / "workspaces" / "chat@local").stat().st_uid
    replica = daemon.api("GET", "/v1/status")["replicas"][0]["pid"]  # type: ignore[index]
    wait_none_left(uid, keep=int(replica))  # the replica may run as the agent's uid too
    assert not left_behind(uid, keep=int(replica))

    # A started process runs at the nice of the intent's priority: high, -5 on the class's (small: 10).
    before = len(fake_model.requests)
    fake_model.script(
        Reply.tools(ToolCall("process-start", {"command": "cut -d' ' -f19 /proc/self/stat"})),
        Reply.tools(ToolCall("process-poll", {"id": "p-4", "wait_ms": 30000})),  # an agent's ids go on counting
        Reply(text="niced"),
    )
    outcome = outcome_of(daemon.cli("dispatch", "nice", "--agent", "chat@local", "--priority", "high", "--json"))
    assert outcome["outcome"] == "ok", outcome
    polled = tool_results(fake_model, before + 2)[-1]
    assert polled.get("exit_code") == 0 and polled["stdout"] == "5\n", polled
    assert daemon.stop() == 0
