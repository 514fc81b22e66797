"""Hostile: JSON nested past the interpreter's recursion limit, sent to every door of a real daemon.

``json.loads`` raises RecursionError, not ValueError, on such a document; each door must still answer
its own clear refusal (never an internal error) and go on serving.
"""

from __future__ import annotations

import socket
import time

import httpx

from covenant.triggers.webhooks import signature_header
from tests.a2a.conftest import rpc, serve_a2a
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.triggers.test_webhooks import SECRET, _free_port

DEEP = b'{"a":' * 20_000 + b"1" + b"}" * 20_000
"""Well-formed JSON, 120 KB, 20,000 levels deep."""


def _raw_post(daemon: DaemonProcess, path: str, body: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(daemon.socket))
        s.sendall(b"POST %s HTTP/1.1\r\nHost: covenant\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (path.encode(), len(body)) + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_the_control_socket_answers_a_deep_body_400(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.start()
    answer = _raw_post(daemon, "/v1/dispatch", DEEP)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b'"bad_request"' in answer and b"deeper than 64 levels" in answer
    assert daemon.cli("dispatch", "echo still here", "--json").returncode == 0


def test_a2a_answers_a_deep_request_with_a_parse_error(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    served = serve_a2a(daemon, expose=("echo",))
    daemon.start()
    answer = httpx.post(served.url("echo"), content=DEEP, timeout=120,
                        headers={**served.headers(), "content-type": "application/json"})
    error = answer.json()["error"]
    assert error["code"] == -32700 and "deeper than 64 levels" in error["message"], answer.text
    sent = rpc(served, "echo", "SendMessage", {"message": {"messageId": "m1", "role": "ROLE_USER",
                                                           "parts": [{"text": "still here"}]}})
    assert sent.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", sent.text


def test_a_webhook_answers_a_signed_deep_body_400(daemon: DaemonProcess) -> None:
    port = _free_port()
    daemon.add_agent("echo", "echo.py")
    daemon.env["HOOK_SECRET"] = SECRET
    daemon.write_config(f"""
        [webhooks]
        listen = "127.0.0.1:{port}"

        [[webhooks.routes]]
        path = "/hooks/echo"
        agent = "echo@local"
        issuer = "tester@test"
        secret_env = "HOOK_SECRET"
    """)
    daemon.start()

    def post(body: bytes) -> httpx.Response:
        header = signature_header(SECRET.encode(), int(time.time()), body)
        return httpx.post(f"http://127.0.0.1:{port}/hooks/echo", content=body, timeout=120,
                          headers={"content-type": "application/json", "Covenant-Signature": header})

    refused = post(DEEP)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "bad_body", refused.text
    assert "deeper than 64 levels" in refused.json()["error"]["message"]
    accepted = post(b'{"text": "still here"}')
    assert accepted.status_code == 200 and accepted.json()["text"] == "still here", accepted.text
