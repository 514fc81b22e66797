"""sd_notify, the watchdog and socket activation against real sockets and processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio

from covenant.daemon.systemd import (
    Notifier,
    activated_unix_listener,
    listen_fds,
    monotonic_usec,
    notify,
    run_watchdog,
    watchdog_interval_s,
)


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> socket.socket:
    """A real AF_UNIX datagram socket, named in NOTIFY_SOCKET, as systemd provides."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


def recv(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_notify_sends_each_state_as_one_datagram(notify_socket: socket.socket) -> None:
    assert notify("READY=1") is True
    assert recv(notify_socket) == "READY=1"
    assert notify("STATUS=serving 3 agents") is True
    assert recv(notify_socket) == "STATUS=serving 3 agents"
    assert notify("STOPPING=1") is True
    assert recv(notify_socket) == "STOPPING=1"
    assert notify("WATCHDOG=1") is True
    assert recv(notify_socket) == "WATCHDOG=1"


def test_notifier_helpers_speak_the_protocol(notify_socket: socket.socket) -> None:
    with Notifier() as n:
        assert n.enabled
        assert n.ready("serving on /run/covenant/covenant.sock")
        assert recv(notify_socket) == "READY=1\nSTATUS=serving on /run/covenant/covenant.sock"
        before = monotonic_usec()
        assert n.reloading()
        lines = recv(notify_socket).split("\n")
        assert lines[0] == "RELOADING=1"
        assert lines[1].startswith("MONOTONIC_USEC=")
        assert before <= int(lines[1].split("=")[1]) <= monotonic_usec()
        assert n.ready()
        assert recv(notify_socket) == "READY=1"
        assert n.status("line one\nREADY=1")
        # A newline in status text must not smuggle in another assignment.
        assert recv(notify_socket) == "STATUS=line one READY=1"
        assert n.stopping()
        assert recv(notify_socket).startswith("STOPPING=1\nSTATUS=")
        for _ in range(3):
            assert n.watchdog()
            assert recv(notify_socket) == "WATCHDOG=1"


def test_abstract_namespace_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"covenant-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    try:
        assert notify("READY=1") is True
        assert recv(sock) == "READY=1"
    finally:
        sock.close()


def test_not_under_systemd_is_a_quiet_false(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False
    assert Notifier().enabled is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert notify("READY=1") is False


def test_notifier_survives_the_manager_going_away(tmp_path: Path) -> None:
    path = tmp_path / "n.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    n = Notifier(str(path))
    assert n.watchdog()
    sock.close()
    path.unlink()
    assert n.watchdog() is False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    assert n.watchdog() is True
    assert recv(sock) == "WATCHDOG=1"
    n.close()
    sock.close()


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    pid = os.getpid()
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}, pid) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(pid)}, pid) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(pid + 1)}, pid) is None
    assert watchdog_interval_s({}, pid) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}, pid) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "soon"}, pid) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "x"}, pid) is None


def test_watchdog_interval_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval_s() == 2.0


async def test_watchdog_pings_arrive_at_the_interval(
    notify_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_watchdog as the daemon runs it, against a real NOTIFY_SOCKET."""
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    period = watchdog_interval_s()
    assert period == 0.2
    notify_socket.setblocking(False)
    trio_sock = trio.socket.from_stdlib_socket(notify_socket)
    stamps: list[float] = []
    with Notifier() as notifier:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_watchdog, notifier, period)
            with trio.fail_after(10):
                for _ in range(4):
                    assert (await trio_sock.recv(100)) == b"WATCHDOG=1"
                    stamps.append(trio.current_time())
            nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    # Never faster than the period; a generous upper bound for a loaded 2-core box.
    assert all(gap >= 0.19 for gap in gaps), gaps
    assert all(gap < 2.0 for gap in gaps), gaps


# What systemd does before exec'ing the service: the socket at fd 3, LISTEN_FDS,
# and LISTEN_PID naming the very process that will run the daemon code.
ACTIVATE_WRAPPER = textwrap.dedent(
    """
    import os, sys
    fd = int(sys.argv[1])
    if fd != 3:
        os.dup2(fd, 3)
        os.close(fd)
    os.environ["LISTEN_FDS"] = "1"
    os.environ["LISTEN_FDNAMES"] = "covenant.socket"
    os.environ["LISTEN_PID"] = str(os.getpid())
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[2]])
    """
)

ACTIVATED_CHILD = textwrap.dedent(
    """
    import json, os
    from covenant.daemon.systemd import listen_fds
    socks = listen_fds()
    info = {
        "count": len(socks),
        "fds": [s.fileno() for s in socks],
        "cloexec": [not os.get_inheritable(s.fileno()) for s in socks],
        "family": [s.family.name for s in socks],
        "env_left": sorted(k for k in os.environ if k.startswith("LISTEN_")),
    }
    print(json.dumps(info), flush=True)
    conn, _ = socks[0].accept()
    conn.sendall(b"hello from fd %d" % socks[0].fileno())
    conn.close()
    """
)


def activate(code: str, sock: socket.socket, **kwargs: object) -> subprocess.Popen[str]:
    fd = sock.fileno()
    return subprocess.Popen(
        [sys.executable, "-c", ACTIVATE_WRAPPER, str(fd), code], pass_fds=(fd,), text=True, **kwargs
    )


def test_listen_fds_serves_a_passed_listening_socket(tmp_path: Path) -> None:
    path = tmp_path / "covenant.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    child = activate(ACTIVATED_CHILD, listener, stdout=subprocess.PIPE)
    listener.close()  # the child holds the only listening descriptor now
    info = json.loads(child.stdout.readline())
    assert info == {"count": 1, "fds": [3], "cloexec": [True], "family": ["AF_UNIX"], "env_left": []}
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(str(path))
    assert client.recv(100) == b"hello from fd 3"
    client.close()
    assert child.wait(timeout=10) == 0
    child.stdout.close()


def test_listen_fds_ignores_another_process_fds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LISTEN_PID", str(os.getpid() + 1))
    monkeypatch.setenv("LISTEN_FDS", "1")
    assert listen_fds() == []
    # Unset either way, so spawned agents never inherit them.
    assert "LISTEN_PID" not in os.environ and "LISTEN_FDS" not in os.environ
    assert listen_fds() == []


WRONG_SOCKET_CHILD = textwrap.dedent(
    """
    from covenant.daemon.systemd import activated_unix_listener
    from covenant.errors import ConfigError
    try:
        activated_unix_listener()
    except ConfigError as exc:
        print(exc.message)
    """
)


def test_activated_listener_rejects_a_datagram_socket() -> None:
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    child = activate(WRONG_SOCKET_CHILD, dgram, stdout=subprocess.PIPE)
    dgram.close()
    out, _ = child.communicate(timeout=30)
    assert "fd 3: family=AF_UNIX type=SOCK_DGRAM" in out and "ListenStream=" in out, out


def test_activated_listener_is_none_without_activation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LISTEN_PID", raising=False)
    monkeypatch.delenv("LISTEN_FDS", raising=False)
    assert activated_unix_listener() is None
