"""Hostile: a Rune agent's tool leaves a process behind while the agent's replica keeps its uid alive.

A tool runs as its agent's uid, like the replica. A process it leaves in a session of its own, with an
empty environment, is found neither in the tool run's tree (it left it before a sample saw it) nor by
the run's marker; the uid sweep, which kills every process of the uid, waits for the uid's last live
root, and the replica is one for as long as it lives. Such a process is covenant's adopted child: when
the uid's last tool run ends and only the replica is left, it is killed and reaped, and the replica goes
on.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import outcome_of
from tests.rune.test_file_tools import tool_events, tool_results
from tests.security.conftest import processes_of_uid, start_with_hostile_tool

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the tool runs as the agent's uid only under a root daemon")


def test_a_process_a_tool_left_behind_ends_with_the_tool_run_while_the_replica_goes_on(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    # No sample during the tool's run: its leftover is never seen in the run's tree (as when it escapes
    # between two samples), so only the end of the tool run can find it.
    start_with_hostile_tool(daemon, fake_model, "linger", "lingerer.py", extra="[runtime]\nsample_interval_ms = 10000\n")
    fake_model.script(Reply(text="up"), Reply.tools(ToolCall("linger", {})), Reply(text="done"))
    assert outcome_of(daemon.cli("dispatch", "hello", "--agent", "chat@local", "--json"))["outcome"] == "ok"
    uid = (daemon.home / "state" / "replicas" / "chat@local").stat().st_uid
    before = set(processes_of_uid(uid))
    assert before, "the replica runs as the agent's uid"

    outcome = outcome_of(daemon.cli("dispatch", "linger", "--agent", "chat@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    assert (outcome["record"]["isolation"], outcome["record"]["uid"]) == ("uid", uid), "the record names the uid it ran as"
    answered = tool_results(fake_model, 2)[-1]
    left = answered["left"]
    assert left not in before
    assert not Path(f"/proc/{left}").exists(), "the tool's leftover outlived its run (or stayed a zombie)"
    assert set(processes_of_uid(uid)) == before, "the replica (and nothing else of its uid) goes on"
    assert "killed processes agents left behind" in daemon.log()
    (event,) = tool_events(daemon, outcome["intent_id"])
    assert event["outcome"] == "ok" and event["left_behind"] == 1, event
    fake_model.script(Reply(text="still here"))
    assert outcome_of(daemon.cli("dispatch", "again", "--agent", "chat@local", "--json"))["text"] == "still here"
