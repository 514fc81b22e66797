"""The webhook and A2A listeners bound their clients (issue 35), on one real daemon:

- a 500-connection slow-body flood from one address (with the daemon's fd limit low enough that the flood
  alone would exhaust it) leaves the webhook listener to a signed request from another address, and
  ``covenant status`` answers;
- a body over the cap gets its 413 with ``Connection: close`` and the connection closed, also for a client
  (httpx) that writes the whole body before it reads;
- a head or a body not whole in time closes the connection unanswered; a connection past the listener's
  cap is closed unread;
- webhook and A2A answers carry the outcome, the text and the intent id, never the record's paths.

No wall-clock figure is asserted: the seconds are bench/listener_flood.py's.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from covenant.client import DaemonClient
from covenant.triggers.webhooks import signature_header
from tests.daemon.conftest import DaemonProcess, daemon_home
from tests.daemon.test_daemon_e2e import wait_for

pytestmark = pytest.mark.xdist_group("listener_bounds")

SECRET = "whsec-listener-bounds-0123456789"
TOKEN_ENV = "A2A_TOKEN_BOUNDS"
FLOOD = 500
PER_SOURCE = 32  # [webhooks] max_connections_per_source, the default
A2A_MAX_CONNECTIONS = 4
LEAKY = 'import sys\nsys.stdin.readline()\nprint("not json from " + __file__, flush=True)\n'
"""An agent whose broken answer puts its own path into the dispatch record's error."""


@dataclass
class Bounded:
    daemon: DaemonProcess
    hook_port: int
    a2a_port: int
    marks: Path
    token: str

    def card_url(self) -> str:
        return f"http://127.0.0.1:{self.a2a_port}/a2a/echo/.well-known/agent-card.json"

    def rpc_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.a2a_port}/a2a/{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bounded]:
    with daemon_home(tmp_path_factory.mktemp("bounds")) as d:
        marks = d.home.parent / "marks"
        marks.mkdir()
        os.chmod(marks, 0o777)
        d.add_agent("mark", "mark.py")
        d.add_agent("echo", "echo.py")
        leaky = d.home / "agents" / "leaky"
        leaky.mkdir()
        (leaky / "leaky.py").write_text(LEAKY)
        (leaky / "agent.toml").write_text('[agent]\nid = "leaky@local"\nname = "leaky"\nversion = "0.1.0"\n'
                                          'runtime = "python3"\nentry = "leaky.py"\n')
        token = "tok-" + secrets.token_hex(16)
        d.env.update(HOOK_SECRET=SECRET, **{TOKEN_ENV: token})
        bounded = Bounded(d, _free_port(), _free_port(), marks, token)
        d.write_config(f"""
            [webhooks]
            listen = "127.0.0.1:{bounded.hook_port}"

            [[webhooks.routes]]
            path = "/hooks/mark"
            agent = "mark@local"
            issuer = "tester@test"
            secret_env = "HOOK_SECRET"
            rate = "600/minute"

            [[webhooks.routes]]
            path = "/hooks/leaky"
            agent = "leaky@local"
            issuer = "tester@test"
            secret_env = "HOOK_SECRET"

            [a2a]
            listen = "127.0.0.1:{bounded.a2a_port}"
            expose = ["echo", "leaky"]
            max_body_kb = 1
            header_timeout_s = 5
            body_timeout_s = 3
            max_connections = {A2A_MAX_CONNECTIONS}

            [[a2a.clients]]
            name = "ci"
            token_env = "{TOKEN_ENV}"
            issuer = "tester@test"
            rate = "600/minute"
        """)
        d.start()
        yield bounded
        assert d.stop() == 0, d.log()
        low, high = d.uid_range
        left = [p.pid for p in psutil.process_iter(["uids"]) if low <= p.info["uids"].real <= high]
        assert left == [], f"processes of the home's agent uids outlived the daemon: {left}"


def _metric(d: DaemonProcess, name: str, **labels: str) -> float:
    with DaemonClient(d.socket) as client:
        text = client._send("GET", "/metrics").read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def _closed(d: DaemonProcess, listener: str, reason: str) -> float:
    return _metric(d, "covenant_listener_closed_total", listener=listener, reason=reason)


def _connect(port: int, source: str) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(30)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def _read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as a close); a timeout fails the test."""
    got = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


def _signed_webhook(b: Bounded, path: str, body: bytes, source: str) -> httpx.Response:
    header = signature_header(SECRET.encode(), int(time.time()), body)
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=60) as client:
        return client.post(f"http://127.0.0.1:{b.hook_port}{path}", content=body,
                           headers={"Covenant-Signature": header, "content-type": "text/plain"})


def test_a_slow_body_flood_from_one_address_leaves_the_webhook_listener_to_others(bounded: Bounded) -> None:
    d = bounded.daemon
    assert d.process is not None
    daemon = psutil.Process(d.process.pid)
    limit = daemon.rlimit(psutil.RLIMIT_NOFILE)
    fds_before = daemon.num_fds()
    # Room for far fewer fds than the flood has connections: without the per-source cap it would take them all.
    daemon.rlimit(psutil.RLIMIT_NOFILE, (fds_before + FLOOD // 4, limit[1]))
    refused_before = _closed(d, "webhooks", "source_cap")
    head = (b"POST /hooks/mark HTTP/1.1\r\nHost: covenant\r\nContent-Type: text/plain\r\nContent-Length: 200\r\n"
            b"Covenant-Signature: t=1,v1=" + b"0" * 64 + b"\r\n\r\nm")  # then nothing more: a body that never ends
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            sock = _connect(bounded.hook_port, "127.0.0.1")
            flood.append(sock)
            try:
                sock.sendall(head)
            except OSError:
                pass  # closed at once: over the cap
        wait_for(lambda: _closed(d, "webhooks", "source_cap") - refused_before == FLOOD - PER_SOURCE,
                 what="every connection past the per-source cap closed unread")
        assert _metric(d, "covenant_listener_connections", listener="webhooks") == PER_SOURCE
        assert daemon.num_fds() <= fds_before + PER_SOURCE + 10

        body = f"mark {bounded.marks}".encode()
        served = _signed_webhook(bounded, "/hooks/mark", body, "127.0.0.2")
        assert served.status_code == 200, served.text
        assert served.json()["outcome"] == "ok"
        assert (bounded.marks / served.json()["intent_id"]).exists()
        assert d.cli("status", timeout=60).returncode == 0
    finally:
        for sock in flood:
            sock.close()
        daemon.rlimit(psutil.RLIMIT_NOFILE, limit)
    wait_for(lambda: _metric(d, "covenant_listener_connections", listener="webhooks") == 0,
             what="the flood's connections closed")


def test_a2a_413_closes_the_connection_also_for_a_client_writing_the_whole_body(bounded: Bounded) -> None:
    headers = {"Authorization": f"Bearer {bounded.token}", "Content-Type": "application/json"}
    big = httpx.post(bounded.rpc_url("echo"), content=b"x" * (4 << 20), headers=headers, timeout=60)
    assert big.status_code == 413 and big.headers["connection"] == "close"
    assert big.json()["error"]["details"][0]["reason"] == "BODY_TOO_LARGE"

    sock = _connect(bounded.a2a_port, "127.0.0.1")
    with sock:
        sock.sendall(b"POST /a2a/echo HTTP/1.1\r\nHost: covenant\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + bounded.token.encode() + b"\r\nContent-Length: 4000000\r\n\r\n"
                     + b"x" * 65536)
        answer = _read_to_end(sock)  # the answer, then the server's close: never a connection left hanging
    assert answer.startswith(b"HTTP/1.1 413 ") and b"connection: close" in answer.lower()


def test_slow_heads_slow_bodies_and_connections_past_the_cap_are_closed_unanswered(bounded: Bounded) -> None:
    d = bounded.daemon
    before = {reason: _closed(d, "a2a", reason) for reason in ("header_timeout", "body_timeout", "connection_cap")}
    held = [_connect(bounded.a2a_port, f"127.0.0.{10 + i}") for i in range(A2A_MAX_CONNECTIONS)]
    for sock in held:
        sock.sendall(b"GET /a2a/echo/.well-known/agent-card.json HTTP/1.1\r\n")  # a head that never ends
    past_cap = _connect(bounded.a2a_port, "127.0.0.20")
    past_cap.sendall(b"GET /a2a/echo/.well-known/agent-card.json HTTP/1.1\r\nHost: covenant\r\n\r\n")
    assert _read_to_end(past_cap) == b""  # closed before any of it was read
    assert [_read_to_end(sock) for sock in held] == [b""] * A2A_MAX_CONNECTIONS  # closed at the head's deadline
    wait_for(lambda: _metric(d, "covenant_listener_connections", listener="a2a") == 0,
             what="the listener to count them gone")  # it does once each close is done, just after the client sees it

    slow_body = _connect(bounded.a2a_port, "127.0.0.21")
    slow_body.sendall(b"POST /a2a/echo HTTP/1.1\r\nHost: covenant\r\nContent-Type: application/json\r\n"
                      b"Authorization: Bearer " + bounded.token.encode() + b"\r\nContent-Length: 100\r\n\r\n{")
    assert _read_to_end(slow_body) == b""  # nothing answered, nothing dispatched
    for sock in (*held, past_cap, slow_body):
        sock.close()
    assert _closed(d, "a2a", "header_timeout") - before["header_timeout"] == A2A_MAX_CONNECTIONS
    assert _closed(d, "a2a", "body_timeout") - before["body_timeout"] == 1
    assert _closed(d, "a2a", "connection_cap") - before["connection_cap"] == 1
    listed = httpx.post(bounded.rpc_url("echo"), json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}},
                        headers={"Authorization": f"Bearer {bounded.token}"}, timeout=60)
    assert listed.json()["result"]["tasks"] == []  # the slow body never became a task
    assert httpx.get(bounded.card_url(), timeout=60).status_code == 200  # the listener serves again


def test_answers_carry_the_outcome_text_and_intent_id_never_the_record(bounded: Bounded) -> None:
    d = bounded.daemon
    leaky_path = str(d.home / "agents" / "leaky" / "leaky.py")
    hook = _signed_webhook(bounded, "/hooks/leaky", b"hello", "127.0.0.1")
    assert hook.status_code == 200 and set(hook.json()) == {"intent_id", "outcome", "text"}, hook.text
    assert hook.json()["outcome"] == "protocol_error"
    record = json.loads(d.cli("show", hook.json()["intent_id"], "--json", check=True).stdout)
    assert leaky_path in record["error"]  # the record has it, for operators
    for private in (leaky_path, str(d.home), '"pid"', '"uid"', '"argv"'):
        assert private not in hook.text

    message = {"message": {"messageId": "m-leaky", "role": "ROLE_USER", "parts": [{"text": "hello"}]}}
    sent = httpx.post(bounded.rpc_url("leaky"), json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                                                      "params": message},
                      headers={"Authorization": f"Bearer {bounded.token}"}, timeout=60)
    task = sent.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED" and "artifacts" not in task
    assert task["status"]["message"]["parts"] == [{"text": "protocol_error"}]
    for private in (leaky_path, str(d.home), '"pid"', '"uid"', '"argv"'):
        assert private not in sent.text
    got = httpx.post(bounded.rpc_url("leaky"), json={"jsonrpc": "2.0", "id": 2, "method": "GetTask",
                                                     "params": {"id": task["id"]}},
                     headers={"Authorization": f"Bearer {bounded.token}"}, timeout=60)
    assert got.json()["result"]["status"]["message"]["parts"] == [{"text": "protocol_error"}]
