"""The daemon's kept-alive connections to a replica and the replica's to its gateway, with real processes: reused
across dispatches and the calls of a turn, a replica killed while they are idle costs the next dispatch nothing,
a stranger on the gateway is still refused, and nothing is left open or running."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from tests.daemon.conftest import DaemonProcess, agent_processes
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.processes import alive
from tests.rune.conftest import add_rune_agent, configure, outcome_of


def _sockets(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:"):
            found.add(target)
    return found


def _connected(table: str, path: str) -> set[str]:
    """Inodes of the accepted connections on the unix socket ``path`` (``/proc/…/net/unix``, state 03)."""
    found = set()
    for line in Path(table).read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 8 and fields[7] == path and fields[5] == "03":
            found.add(fields[6])
    return found


def _until(what: str, check, deadline_s: float = 60):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + deadline_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def _replica(d: DaemonProcess) -> dict:
    (replica,) = d.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
    return replica


def _dispatch_ok(d: DaemonProcess, fake_model: FakeModelServer, text: str) -> dict:
    fake_model.script(Reply.tools(ToolCall("system-time", {})), Reply(text=text))
    outcome = outcome_of(d.cli("dispatch", "what time is it?", "--agent", "chat@local", "--json"))
    assert outcome["outcome"] == "ok" and outcome["text"] == text, outcome
    assert outcome["usage"]["model_calls"] == 2 and outcome["usage"]["tool_calls"] == 1
    return outcome


def test_kept_connections_across_dispatches_a_stranger_and_a_replica_killed_while_idle(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    configure(daemon, ("fake", fake_model))
    # Health probes only while it starts: a probe running beside an invoke would keep a second connection.
    add_rune_agent(daemon, runtime="startup_timeout_ms: 30000\nhealth_probe:\n  path: /health\n  interval_ms: 600000")
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.system_time", check=True)
    assert daemon.process is not None

    # One turn is an invoke and three gateway calls one after the other (model, tool, model): they leave
    # one connection to the gateway open, and the next turn's calls go on that very one; the invoke's
    # connection stays open too.
    folder = daemon.home / "state" / "replicas" / "chat@local"
    gateway, replica_sock = str(folder / "gateway.sock"), str(folder / "replica.sock")
    _dispatch_ok(daemon, fake_model, "first")
    pid = _replica(daemon)["pid"]
    # An accepted connection is listed in the network namespace of the process that connected: the
    # gateway's in the replica's own, the replica's in the daemon's.
    to_gateway = _connected(f"/proc/{pid}/net/unix", gateway)
    invokes = _connected("/proc/net/unix", replica_sock)
    assert len(to_gateway) == 1 and len(invokes) == 1
    _dispatch_ok(daemon, fake_model, "second")
    assert _connected(f"/proc/{pid}/net/unix", gateway) == to_gateway
    assert _connected("/proc/net/unix", replica_sock) == invokes

    # A stranger on the gateway socket is refused as before, even while the replica's connection is kept.
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(gateway)
        s.sendall(b"POST /v1/model HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 403") and len(fake_model.requests) == 4

    # The replica killed while the daemon keeps an idle connection to it: the next dispatch goes to its
    # next life on a new connection, and the daemon holds no more sockets than before.
    daemon_sockets = len(_sockets(daemon.process.pid))
    os.kill(pid, signal.SIGKILL)
    _until("the replica's next life", lambda: (r := _replica(daemon))["state"] == "ready" and r["pid"] != pid)
    _dispatch_ok(daemon, fake_model, "third")
    new_pid = _replica(daemon)["pid"]
    assert not alive(pid) and new_pid != pid
    # (At most as many: the count before may hold a control connection the daemon was still closing.)
    _until("the daemon's sockets back to what they were",
           lambda: len(_sockets(daemon.process.pid)) <= daemon_sockets)
    assert len(_connected(f"/proc/{new_pid}/net/unix", gateway)) == 1

    assert daemon.stop() == 0
    assert not agent_processes(daemon.home) and not alive(new_pid)
