"""Hostile: a Rune agent's tool leaves a process that takes over a socket of its replica.

Tool processes run as the agent's uid, as its replica does, so one may replace ``replica.sock`` or
``gateway.sock`` with a server of its own. The daemon talks only to its replica's own process, and the
replica only to the daemon: each checks the peer of every connection; a replica whose socket, or whose
gateway, another process serves is restarted, and the restart's uid sweep ends the impostor.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

import psutil
import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.daemon.test_daemon_e2e import wait_for
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_process_tool, add_rune_agent, configure, outcome_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the tool runs as the agent's uid only under a root daemon")

IMPOSTOR = Path(__file__).parent / "agents" / "impostor_tool.py"


def _hijacked(daemon: DaemonProcess, fake_model: FakeModelServer, socket_path: Path, next_answer: str) -> int:
    """A daemon whose agent chat@local has the hijack tool; one intent has run it against ``socket_path``
    and ended, and the impostor it left now serves that socket. Returns the agent's uid."""
    configure(daemon, ("fake", fake_model))
    # Probes far apart: what meets the impostor is what has the replica replaced, not a probe's timing.
    package = add_rune_agent(daemon, toolset=("hijack",), runtime="""
        startup_timeout_ms: 30000
        health_probe:
          path: /health
          interval_ms: 600000
    """)
    add_process_tool(package, "hijack", IMPOSTOR.read_text())
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.hijack", check=True)
    go = daemon.home.parent / "go"
    fake_model.script(Reply.tools(ToolCall("hijack", {"socket": str(socket_path), "go": str(go)})), Reply(text="done"),
                      Reply(text=next_answer))
    first = outcome_of(daemon.cli("dispatch", "take over", "--agent", "chat@local", "--json"))
    assert first["outcome"] == "ok" and first["text"] == "done", first
    serving = _served_by(socket_path)
    go.touch()
    wait_for(lambda: _served_by(socket_path) not in (None, serving), what=f"the impostor serving {socket_path.name}")
    return socket_path.stat().st_uid


def test_a_process_serving_the_replica_socket_is_not_taken_for_the_replica(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    uid = _hijacked(daemon, fake_model, daemon.home / "state" / "replicas" / "chat@local" / "replica.sock",
                    "the real replica")

    second = outcome_of(daemon.cli("dispatch", "who answers?", "--agent", "chat@local", "--json"))
    assert second["outcome"] == "crashed" and "not the replica" in second["error"], second
    wait_for(lambda: "the replica's socket is served by another process" in daemon.log(), what="the probe's finding")

    wait_for(lambda: not [p for p in psutil.process_iter(["uids"])
                          if p.info["uids"].real == uid and p.pid != _replica_pid(daemon)],
             what="the impostor swept, and reaped, with the replaced replica's uid")
    third = outcome_of(daemon.cli("dispatch", "and now?", "--agent", "chat@local", "--json"))
    assert third["outcome"] == "ok" and third["text"] == "the real replica", third


def test_a_process_serving_the_gateway_socket_is_not_taken_for_the_daemon(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    uid = _hijacked(daemon, fake_model, daemon.home / "state" / "replicas" / "chat@local" / "gateway.sock",
                    "the real model")
    replica = _replica_pid(daemon)

    second = outcome_of(daemon.cli("dispatch", "who answers?", "--agent", "chat@local", "--json"))
    assert second.get("text") != "impostor", second
    assert second["outcome"] == "provider_unavailable" and "is not the daemon's" in second["error"], second
    wait_for(lambda: "the gateway socket is served by another process; exiting" in daemon.log(), what="the replica's exit")
    wait_for(lambda: _replica_pid(daemon) not in (None, replica), what="a new replica")
    wait_for(lambda: not [p for p in psutil.process_iter(["uids"])
                          if p.info["uids"].real == uid and p.pid != _replica_pid(daemon)],
             what="the impostor swept, and reaped, with the replaced replica's uid")
    third = outcome_of(daemon.cli("dispatch", "and now?", "--agent", "chat@local", "--json"))
    assert third["outcome"] == "ok" and third["text"] == "the real model", third
    assert len(fake_model.requests) == 3  # the impostor answered no model call that reached the record


def _served_by(path: Path) -> int | None:
    """The pid of the process listening on the unix socket ``path`` (None when no one is)."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return None
        pid, _uid, _gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid


def _replica_pid(daemon: DaemonProcess) -> int | None:
    replicas = daemon.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
    return replicas[0]["pid"] if replicas else None
