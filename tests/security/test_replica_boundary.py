"""Hostile: a Rune agent's tool goes after its replica, which runs as the same uid.

The replica holds every in-flight intent of its agent, other issuers' turns included; it makes itself
non-dumpable, so /proc and ptrace give a process of its uid nothing of it. Its socket serves the daemon
only, and the daemon's gateway socket the replica only: a tool can neither have the replica run an
intent for it nor hold the daemon with a request it never finishes.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of
from tests.rune.test_file_tools import tool_results
from tests.security.conftest import start_with_hostile_tool

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the tool runs as the agent's uid only under a root daemon")


def test_a_tool_cannot_read_its_replicas_memory(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    start_with_hostile_tool(daemon, fake_model, "peek", "replica_peek.py")
    fake_model.script(Reply.tools(ToolCall("peek", {})), Reply(text="done"))
    outcome = outcome_of(daemon.cli("dispatch", "peek", "--agent", "chat@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    tried = tool_results(fake_model, 1)[-1]
    assert tried == {"replica": True, "environ": "PermissionError", "mem": "PermissionError", "fd": "PermissionError"}, tried


def test_a_tool_can_neither_invoke_its_replica_nor_hold_the_gateway(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    start_with_hostile_tool(daemon, fake_model, "knock", "replica_knock.py")
    folder = daemon.home / "state" / "replicas" / "chat@local"
    fake_model.script(Reply.tools(ToolCall("knock", {"folder": str(folder)})), Reply(text="done"),
                      Reply(text="yes (a model call the tool made through the replica)"))
    outcome = outcome_of(daemon.cli("dispatch", "knock", "--agent", "chat@local", "--json"))
    assert outcome["outcome"] == "ok" and outcome["text"] == "done", outcome
    tried = tool_results(fake_model, 1)[-1]
    assert tried == {"invoke": "HTTP/1.1 403 Forbidden", "hold": "answered"}, tried
    assert len(fake_model.requests) == 2, "the replica called the model for the tool"
    assert "connection refused: not the process this socket serves" in daemon.log()


def test_a_tool_flooding_the_gateway_is_paced_and_the_replica_is_still_served(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """A tool that connects to the gateway in a loop: the daemon answers at most a budget of refusals and
    closes the rest unanswered, accepting one of those every 5 ms, so the flood costs the agent's own
    socket, not the daemon's loop (before: ≈ 2,300 connections a second, the daemon at ≈ 80 % of a core).
    The replica's own model call, queued behind the flood, is still answered."""
    seconds = 3
    start_with_hostile_tool(daemon, fake_model, "flood", "replica_flood.py")
    folder = daemon.home / "state" / "replicas" / "chat@local"
    fake_model.script(Reply.tools(ToolCall("flood", {"folder": str(folder), "seconds": seconds})), Reply(text="done"))
    outcome = outcome_of(daemon.cli("dispatch", "flood", "--agent", "chat@local", "--json"))
    assert outcome["outcome"] == "ok" and outcome["text"] == "done", outcome
    flood = tool_results(fake_model, 1)[-1]
    # At most 32 answered at once and 32 a second after, 200 a second closed unanswered, 128 in the backlog.
    assert flood["connections"] <= 32 + (32 + 200) * seconds + 128 + 16, flood
    assert 0 < flood["answered"] <= 32 + 32 * seconds + 2, flood
    assert daemon.log().count("connection refused: not the process this socket serves") == 1


def test_a_file_hard_linked_into_the_replicas_folder_is_not_given_to_the_agent(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """The replica's folder is the agent uid's; at each replica start the daemon (root) makes what is in it
    the uid's. A hard link the agent made there to a file it does not own (possible where
    fs.protected_hardlinks is off; the test, as root, makes it) must not hand that file over."""
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, toolset=())
    daemon.start()
    fake_model.script(Reply(text="first"), Reply(text="second"))
    assert outcome_of(daemon.cli("dispatch", "hello", "--agent", "chat@local", "--json"))["text"] == "first"
    folder = daemon.home / "state" / "replicas" / "chat@local"
    victim = daemon.home / "identity" / "planted-victim"
    victim.write_text("root's own")
    os.chmod(victim, 0o600)
    os.link(victim, folder / "planted")
    (replica,) = daemon.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
    os.kill(int(replica["pid"]), signal.SIGKILL)  # the next start prepares the folder again
    assert outcome_of(daemon.cli("dispatch", "again", "--agent", "chat@local", "--json"))["text"] == "second"
    assert (victim.stat().st_uid, victim.stat().st_mode & 0o777) == (0, 0o600)
    assert "a hard-linked file in a replica's folder is not given to the agent" in daemon.log()
