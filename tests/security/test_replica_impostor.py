"""Hostile: a process of a Rune agent's uid takes over a socket of its replica.

Tool processes run as the agent's uid, as its replica does, and one that escaped its run with an
empty environment lives as long as the replica keeps the uid alive; it may replace ``replica.sock`` or
``gateway.sock`` with a server of its own. The daemon talks only to its replica's own process, and the
replica only to the daemon: each checks the peer of every connection; a replica whose socket, or whose
gateway, another process serves is restarted, and binds its sockets anew.

Connections are kept (HTTP keep-alive both ways): one made before the impostor came still reaches the
process it was checked against, so the impostor is met by a new connection. The tests make one by
keeping the kept connection busy: a first dispatch waits on a slow model answer while the second runs.

The tests start the impostor themselves, as the agent's uid with an empty environment: whether a
tool's leftover escapes its run's sweep depends on the sampler's timing, and is not what is tested.
Such a leftover is covenant's adopted child, and the restart's uid sweep kills and reaps it
(tests/security/test_attacker_corpus.py checks the sweep and the reaping of an escape); the test's
own impostor is not covenant's child, so the test ends it.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.daemon.test_daemon_e2e import wait_for
from tests.fakes import FakeModelServer, Reply
from tests.rune.conftest import add_rune_agent, configure, outcome_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as uids of their own only under a root daemon")

IMPOSTOR = Path(__file__).parent / "agents" / "impostor.py"
SYSTEM_PYTHON = "/usr/bin/python3"
"""An interpreter other uids may run (the one on PATH may live in a 0700 home)."""


@contextmanager
def _impostor(daemon: DaemonProcess, fake_model: FakeModelServer, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """chat@local's replica up (one intent answered), then a process of its uid serving its ``name`` socket."""
    configure(daemon, ("fake", fake_model))
    # Probes far apart: what meets the impostor is what has the replica replaced, not a probe's timing.
    add_rune_agent(daemon, toolset=(), runtime="""
        startup_timeout_ms: 30000
        health_probe:
          path: /health
          interval_ms: 600000
    """)
    daemon.start()
    fake_model.script(Reply(text="first"))
    assert outcome_of(daemon.cli("dispatch", "hello", "--agent", "chat@local", "--json"))["text"] == "first"
    sock = socket_path(daemon, name)
    uid, gid = sock.parent.stat().st_uid, sock.parent.stat().st_gid
    script = daemon.home.parent / "impostor.py"
    shutil.copy(IMPOSTOR, script)
    script.chmod(0o644)
    serving = _served_by(sock)

    def become_the_agent() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    impostor = subprocess.Popen([SYSTEM_PYTHON, str(script), str(sock)], env={}, cwd="/",
                                preexec_fn=become_the_agent, start_new_session=True)
    try:
        wait_for(lambda: _served_by(sock) not in (None, serving), what=f"the impostor serving {name}")
        yield impostor
    finally:
        if impostor.poll() is None:
            impostor.kill()
        impostor.wait()


@contextmanager
def _kept_connection_busy(daemon: DaemonProcess, fake_model: FakeModelServer) -> Iterator[None]:
    """A dispatch in flight on the kept connections (daemon → replica, replica → gateway), its model answer
    slow, while the block runs: what the block dispatches needs connections of its own. The slow one
    must never have been answered by the impostor, whatever else became of it."""
    fake_model.script(Reply(text="held", delay_s=3), Reply(text="the real one"))
    asked = len(fake_model.requests)
    held = daemon.cli_background("dispatch", "hold on", "--agent", "chat@local", "--json")
    try:
        wait_for(lambda: len(fake_model.requests) > asked, what="the first dispatch at the model")
        yield
    finally:
        out, err = held.communicate(timeout=120)
    assert "impostor" not in out, (out, err)


def test_a_process_serving_the_replica_socket_is_not_taken_for_the_replica(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    with _impostor(daemon, fake_model, "replica.sock") as impostor:
        with _kept_connection_busy(daemon, fake_model):
            second = outcome_of(daemon.cli("dispatch", "who answers?", "--agent", "chat@local", "--json"))
            assert second["outcome"] == "crashed" and "not the replica" in second["error"], second
        wait_for(lambda: "the replica's socket is served by another process" in daemon.log(), what="the finding")
        wait_for(lambda: _served_by(socket_path(daemon, "replica.sock")) == _replica_pid(daemon) is not None,
                 what="a new replica serving its socket")
        assert impostor.poll() is None  # still there, and no longer reached
        third = outcome_of(daemon.cli("dispatch", "and now?", "--agent", "chat@local", "--json"))
        assert third["outcome"] == "ok" and third["text"] == "the real one", third


def test_a_process_serving_the_gateway_socket_is_not_taken_for_the_daemon(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    with _impostor(daemon, fake_model, "gateway.sock") as impostor:
        replica = _replica_pid(daemon)
        with _kept_connection_busy(daemon, fake_model):
            second = outcome_of(daemon.cli("dispatch", "who answers?", "--agent", "chat@local", "--json"))
            assert second.get("text") != "impostor", second
            assert second["outcome"] == "provider_unavailable" and "is not the daemon's" in second["error"], second
        wait_for(lambda: "the gateway socket is served by another process; exiting" in daemon.log(),
                 what="the replica's exit")
        wait_for(lambda: _replica_pid(daemon) not in (None, replica), what="a new replica")
        assert _served_by(socket_path(daemon, "gateway.sock")) == daemon.process.pid  # bound anew for it
        assert impostor.poll() is None  # still there, and no longer reached
        third = outcome_of(daemon.cli("dispatch", "and now?", "--agent", "chat@local", "--json"))
        assert third["outcome"] == "ok" and third["text"] == "the real one", third
        assert len(fake_model.requests) == 3  # the first, the held one, the third: the impostor answered none


def socket_path(daemon: DaemonProcess, name: str) -> Path:
    return daemon.home / "state" / "replicas" / "chat@local" / name


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
