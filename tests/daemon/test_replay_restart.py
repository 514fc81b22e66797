"""Replay protection survives a restart: a captured signed request runs its agent once, ever."""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import threading
from pathlib import Path

from tests.daemon.conftest import DaemonProcess
from tests.daemon.test_daemon_e2e import audit_records, wait_for


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def capture_cli_request(daemon: DaemonProcess, *args: str) -> bytes:
    """The exact bytes `covenant ARGS…` sends, caught on a socket standing in for the daemon's."""
    folder = Path(tempfile.mkdtemp(prefix="cov-cap-"))
    path = folder / "capture.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    captured: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            captured.append(_read_request(conn))
            body = b'{"error":{"code":"shutting_down","message":"capture only"}}'
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    result = daemon.cli(*args, env={"COVENANT_SOCKET": str(path)})
    thread.join(timeout=60)
    server.close()
    os.unlink(path)
    os.rmdir(folder)
    assert captured, f"the CLI sent nothing: {result.stdout}{result.stderr}"
    return captured[0]


def send_raw(socket_path: Path, request: bytes) -> tuple[int, dict]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(120)
        conn.connect(str(socket_path))
        conn.sendall(request)
        data = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                lengths = [int(l.split(b":", 1)[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if lengths and len(body) >= lengths[0]:
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_a_captured_request_is_refused_after_a_restart_and_the_agent_ran_once(daemon: DaemonProcess) -> None:
    marks = daemon.home.parent / "marks"
    marks.mkdir()
    marks.chmod(0o777)  # the agent runs as an agent uid of its own
    daemon.add_agent("mark", "mark.py", keywords=("mark",))
    daemon.start()
    request = capture_cli_request(daemon, "dispatch", f"mark {marks}", "--agent", "mark@local")
    assert b"POST /v1/dispatch" in request and b'"signature"' in request

    status, outcome = send_raw(daemon.socket, request)
    assert status == 200 and outcome["outcome"] == "ok", outcome
    intent_id = outcome["intent_id"]
    status, again = send_raw(daemon.socket, request)
    assert status == 409 and again["error"]["code"] == "replayed_intent"

    assert daemon.stop() == 0
    daemon.start()
    status, replayed = send_raw(daemon.socket, request)
    assert status == 409, replayed
    assert replayed["error"]["code"] == "replayed_intent" and intent_id in replayed["error"]["message"]
    assert sorted(p.name for p in marks.iterdir()) == [intent_id]  # the agent ran once

    # After a kill -9 too: the ids come from the durable audit log, not from a clean shutdown.
    daemon.stop(sig=9)
    daemon.start()
    status, replayed = send_raw(daemon.socket, request)
    assert status == 409 and replayed["error"]["code"] == "replayed_intent"
    assert sorted(p.name for p in marks.iterdir()) == [intent_id]
    fresh = daemon.cli("dispatch", f"mark {marks}", "--agent", "mark@local")  # a new intent still runs
    assert fresh.returncode == 0, fresh.stderr
    assert len(list(marks.iterdir())) == 2
    assert daemon.stop() == 0


def test_intents_a_killed_daemon_left_unfinished_are_recorded_interrupted_at_the_next_start(daemon: DaemonProcess) -> None:
    """The audit log tells how every intent ended, also when the daemon did not: after a kill -9, the next
    start records an intent.interrupted for each intent it had received and not finished; never twice."""
    daemon.add_agent("slow", "slow.py", keywords=("sleep",))
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.add_agent("locked", "echo.py", keywords=("locked",), required=("tool.secret",))
    daemon.start()
    finished = json.loads(daemon.cli("dispatch", "echo done", "--json", check=True).stdout)["intent_id"]
    assert daemon.cli("dispatch", "echo dry", "--dry-run", "--json").returncode == 0
    assert daemon.cli("dispatch", "locked out", "--json").returncode == 3  # denied: ended at its decision
    running = daemon.cli_background("dispatch", "sleep 120", "--agent", "slow@local", "--json")
    wait_for(lambda: any(r["type"] == "agent.spawned" and r["data"]["agent"] == "slow@local" for r in audit_records(daemon)),
             what="the slow agent to start")
    spawned = next(r["data"] for r in audit_records(daemon) if r["type"] == "agent.spawned" and r["data"]["agent"] == "slow@local")

    daemon.stop(sig=signal.SIGKILL)
    running.communicate(timeout=60)
    daemon.start()
    interrupted = [r["data"] for r in audit_records(daemon) if r["type"] == "intent.interrupted"]
    assert [(d["intent"], d["agent"]) for d in interrupted] == [(spawned["intent"], "slow@local")], interrupted
    assert interrupted[0]["issuer"] and interrupted[0]["parent"] is None and interrupted[0]["received"].endswith("Z")
    assert "without a clean stop" in interrupted[0]["reason"]
    assert finished != spawned["intent"]
    assert "intents left unfinished by the daemon's last run" in daemon.log()
    shown = json.loads(daemon.cli("show", spawned["intent"], "--json", check=True).stdout)
    assert (shown["outcome"], shown["agent_id"], shown["pid"], shown["argv"]) == (
        "interrupted", "slow@local", spawned["pid"], spawned["argv"]), shown
    assert "without a clean stop" in shown["error"] and shown["started_at"] == interrupted[0]["received"]
    assert "interrupted" in daemon.cli("show", spawned["intent"], check=True).stdout

    daemon.stop(sig=signal.SIGKILL)  # killed again, with nothing in flight: nothing new to report
    daemon.start()
    assert daemon.stop() == 0  # and a clean stop: nothing either
    daemon.start()
    assert [r["data"]["intent"] for r in audit_records(daemon) if r["type"] == "intent.interrupted"] == [spawned["intent"]]
    history = json.loads(daemon.cli("history", "--agent", "slow@local", "--json", check=True).stdout)
    assert [(r["intent_id"], r["outcome"]) for r in history] == [(spawned["intent"], "interrupted")]  # one record
    assert daemon.cli("audit", "verify").returncode == 0
