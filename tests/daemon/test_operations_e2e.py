"""Operations against a real daemon: sd_notify, the watchdog, socket activation, metrics, logs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from covenant.client import DaemonClient
from tests.daemon.conftest import DaemonProcess


def _datagrams(sock: socket.socket, until: float) -> list[str]:
    messages = []
    sock.settimeout(0.1)
    while time.monotonic() < until:
        try:
            messages.append(sock.recv(4096).decode())
        except socket.timeout:
            continue
    return messages


def test_notify_ready_status_watchdog_stopping(daemon: DaemonProcess, tmp_path: Path) -> None:
    notify_path = daemon.socket.parent / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    daemon.env.update(NOTIFY_SOCKET=str(notify_path), WATCHDOG_USEC="400000")
    daemon.start()  # returns once the control socket answers

    messages = _datagrams(notify, time.monotonic() + 2.0)
    ready = [i for i, m in enumerate(messages) if "READY=1" in m.split("\n")]
    assert ready, messages
    assert any(line.startswith("STATUS=serving") for m in messages for line in m.split("\n"))
    # WATCHDOG_USEC=0.4 s: pings every 0.2 s; 2 s of listening must see several, not one.
    assert sum("WATCHDOG=1" in m for m in messages) >= 3

    daemon.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert daemon.process.wait(timeout=60) == 0  # type: ignore[union-attr]
    after = _datagrams(notify, time.monotonic() + 0.3)
    assert any("STOPPING=1" in m.split("\n") for m in after), after


def test_ready_only_after_socket_serves(daemon: DaemonProcess) -> None:
    notify_path = daemon.socket.parent / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(60)
    env = {**daemon.env, "NOTIFY_SOCKET": str(notify_path)}
    proc = subprocess.Popen([sys.executable, "-m", "covenant", "daemon"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while "READY=1" not in notify.recv(4096).decode().split("\n"):
            pass
        # At the moment READY=1 arrives, the API must already answer.
        with DaemonClient(daemon.socket, timeout=10) as client:
            assert client.request("GET", "/v1/status")["shutting_down"] is False
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_socket_activation_dispatch_through_fd3(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(daemon.socket))
    listener.listen(16)
    fd = listener.fileno()
    env = {k: v for k, v in daemon.env.items() if k != "COVENANT_SOCKET"}
    env.update(LISTEN_FDS="1", COVENANT_SOCKET="/nonexistent/ignored.sock")
    proc = subprocess.Popen(
        ["sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"', sys.executable, "-m", "covenant", "daemon"],
        env=env,
        pass_fds=(3,),
        preexec_fn=lambda: os.dup2(fd, 3),  # the activated socket must be fd 3 in the daemon
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    listener.close()  # the daemon holds its own copy now
    try:
        result = None
        for _ in range(600):
            result = daemon.cli("dispatch", "echo via activation", env={"COVENANT_SOCKET": str(daemon.socket)})
            if result.returncode != 5:
                break
            time.sleep(0.1)
        assert result is not None and result.returncode == 0, result.stderr if result else None
        assert result.stdout.strip() == "echo via activation"
        with DaemonClient(daemon.socket) as client:
            assert client.request("GET", "/v1/status")["sockets"] == [str(daemon.socket)]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    # The daemon did not create the activated socket, so it leaves the file to systemd.
    assert daemon.socket.exists()


def _metric(text: str, name: str, labels: dict[str, str]) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_metrics_move_with_dispatches(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.add_agent("guarded", "echo.py", keywords=("guarded",), required=("tool.secret",))
    # One file with two problems is one rejected file.
    (daemon.home / "agents" / "broken.toml").write_text('[agent]\nid = "Not An Id"\nversion = 7\n')
    daemon.start()

    def scrape() -> str:
        with DaemonClient(daemon.socket) as client:
            response = client._send("GET", "/metrics")
            assert response.status == 200
            return response.read().decode()

    before = scrape()
    for i in range(3):
        assert daemon.cli("dispatch", f"echo {i}").returncode == 0
    assert daemon.cli("dispatch", "guarded x").returncode == 3
    after = scrape()
    ok = {"agent": "echo@local", "outcome": "ok"}
    assert _metric(after, "covenant_dispatches_total", ok) - _metric(before, "covenant_dispatches_total", ok) == 3
    assert _metric(after, "covenant_policy_denials_total", {"reason": "capability_denied"}) == 1
    assert _metric(after, "covenant_registry_agents", {}) == 2
    assert _metric(after, "covenant_registry_rejected_files", {}) == 1
    assert len(daemon.api("GET", "/v1/agents")["problems"]) > 1  # type: ignore[index]
    # The capability denial was answered 403 on the control socket.
    assert _metric(after, "covenant_http_refused_total", {"listener": "control", "code": "403"}) == 1
    assert _metric(after, "covenant_audit_batch_records_count", {}) > 0


def test_agent_stderr_lines_carry_agent_and_intent(daemon: DaemonProcess) -> None:
    daemon.add_agent("chatty", "chatty.py", keywords=("chatty",))
    daemon.env["COVENANT_LOG_FORMAT"] = "json"
    daemon.start()
    doc = json.loads(daemon.cli("dispatch", "chatty please", "--json", check=True).stdout)
    assert daemon.stop() == 0
    events = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
    stderr_events = [e for e in events if e.get("line") in ("chatty starting", "chatty: still here")]
    assert len(stderr_events) == 2, daemon.log()
    for event in stderr_events:
        assert event["agent"] == "chatty@local"
        assert event["intent"] == doc["intent_id"]


def test_an_agent_flooding_its_stderr_is_logged_within_its_budget_and_read_at_its_pace(daemon: DaemonProcess) -> None:
    """Hostile: a process writing stderr as fast as it can would fill the operator's disk with log lines
    and hold the daemon's loop. Past its burst it logs its rate; the rest is counted to the byte."""
    daemon.write_config("""
        [runtime]
        stderr_log_burst = 20
        stderr_log_lines_per_s = 5
    """)
    daemon.add_agent("flood", "flood.py", keywords=("flood",))
    daemon.env["COVENANT_LOG_FORMAT"] = "json"
    daemon.start()
    doc = json.loads(daemon.cli("dispatch", "flood for 2", "--json", check=True).stdout)
    assert doc["outcome"] == "ok"
    written = int(doc["text"])
    record = daemon.api("GET", f"/v1/dispatches/{doc['intent_id']}")
    assert daemon.stop() == 0
    events = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
    ours = [e for e in events if e.get("intent") == doc["intent_id"]]
    lines = [e["line"] for e in ours if e["msg"] == "agent stderr"]
    reports = [e for e in ours if e["msg"] == "agent stderr suppressed"]
    seconds = record["duration_ms"] / 1000  # type: ignore[index]
    assert 20 <= len(lines) <= 20 + 5 * (seconds + 1), (len(lines), seconds)
    assert reports and all(r["level"] == "warning" and r["agent"] == "flood@local" for r in reports)
    assert sum(len(line) + 1 for line in lines) + sum(r["dropped_bytes"] for r in reports) == written
    assert written > 2 * 65536  # the agent wrote well past its pipe: the pipe was read, at its pace
    assert record["stderr_tail"].endswith("flood over\n")  # type: ignore[index]
    assert record["stderr_unlogged_bytes"] == sum(r["dropped_bytes"] for r in reports)  # type: ignore[index]
    shown = daemon.cli("show", doc["intent_id"], check=True).stdout  # read from the home: no daemon needed
    assert f"{record['stderr_unlogged_bytes']} bytes over the log budget, not logged" in shown  # type: ignore[index]


def test_logs_command_shows_recent_lines(daemon: DaemonProcess) -> None:
    daemon.add_agent("chatty", "chatty.py", keywords=("chatty",))
    daemon.start()
    daemon.cli("dispatch", "chatty please", check=True)
    result = daemon.cli("logs", "--agent", "chatty@local", check=True)
    assert "chatty starting" in result.stdout
    assert "agent=chatty@local" in result.stdout


def test_logs_follow_streams_live_lines_across_a_reload(daemon: DaemonProcess) -> None:
    daemon.add_agent("chatty", "chatty.py", keywords=("chatty",))
    daemon.start()
    follower = subprocess.Popen([sys.executable, "-m", "covenant", "logs", "-f", "--agent", "chatty@local"],
                                env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        intents = []
        for _ in range(2):
            intents.append(json.loads(daemon.cli("dispatch", "chatty please", "--json", check=True).stdout)["intent_id"])
            daemon.cli("reload", check=True)
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while seen != set(intents) and time.monotonic() < deadline:
            line = follower.stdout.readline()  # type: ignore[union-attr]
            assert line, follower.stderr.read()  # type: ignore[union-attr]
            seen.update(i for i in intents if f"intent={i}" in line and "chatty starting" in line)
        assert seen == set(intents)
    finally:
        follower.kill()
        follower.wait()


def test_closed_connections_do_not_linger(daemon: DaemonProcess) -> None:
    """Clients that hang up without `Connection: close` must not leave sockets behind."""
    import psutil

    daemon.start()
    assert daemon.process is not None
    proc = psutil.Process(daemon.process.pid)
    baseline = proc.num_fds()
    for _ in range(100):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(daemon.socket))
        client.sendall(b"GET /v1/status HTTP/1.1\r\nhost: x\r\n\r\n")
        response = b""
        while b"\r\n\r\n" not in response:
            response += client.recv(65536)
        assert response.startswith(b"HTTP/1.1 200")
        client.close()
    deadline = time.monotonic() + 10  # far below hypercorn's 30 s keep-alive timer
    while proc.num_fds() > baseline + 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.num_fds() <= baseline + 5


def test_a_dispatch_whose_client_hangs_up_runs_to_its_end_and_is_recorded(daemon: DaemonProcess) -> None:
    from tests.daemon.test_daemon_e2e import slow_dispatches_in_flight, status, wait_for

    daemon.add_agent("slow", "slow.py", keywords=("sleep",))
    daemon.start()
    (client,) = slow_dispatches_in_flight(daemon, 1, 2)
    client.kill()  # the CLI is gone before the answer: writing it fails
    client.wait()
    wait_for(lambda: not status(daemon)["in_flight"], what="the dispatch to end")
    records = daemon.api("GET", "/v1/dispatches?limit=5")["dispatches"]  # type: ignore[index]
    assert [(r["agent_id"], r["outcome"]) for r in records] == [("slow@local", "ok")]
    log = daemon.log()
    assert "internal error" not in log and "request failed" not in log, log


def test_daemon_lifts_its_open_files_limit(daemon: DaemonProcess) -> None:
    import resource

    import psutil

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the daemon inherits a low soft limit
    try:
        daemon.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert daemon.process is not None
    daemon_soft, _ = psutil.Process(daemon.process.pid).rlimit(psutil.RLIMIT_NOFILE)
    assert daemon_soft == (65536 if hard == resource.RLIM_INFINITY else min(hard, 65536))
