"""covenant.client against real unix-socket peers that misbehave in HTTP ways a daemon never should."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from covenant.client import DaemonClient, DaemonUnreachable, RemoteError


class OneShotServer:
    """Accepts one connection, reads the request head (and body), answers with fixed bytes, closes."""

    def __init__(self, path: Path, answer: bytes) -> None:
        self.path = path
        self.answer = answer
        self.request = b""
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            while b"\r\n\r\n" not in self.request:
                self.request += conn.recv(65536)
            head, _, body = self.request.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += conn.recv(65536)
                self.request = head + b"\r\n\r\n" + body
            conn.sendall(self.answer)

    def close(self) -> None:
        self._thread.join(timeout=10)
        self._listener.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    servers: list[OneShotServer] = []

    def start(answer: bytes) -> OneShotServer:
        server = OneShotServer(tmp_path / f"s{len(servers)}.sock", answer)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def test_request_and_json_answer(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}')
    assert DaemonClient(server.path, timeout=10).request("POST", "/v1/dispatch", {"x": "é"}) == {"ok": True}
    head, _, body = server.request.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"POST /v1/dispatch HTTP/1.1"
    assert b"Connection: close" in head and b"Content-Length: %d" % len(body) in head
    assert body.decode() == '{"x": "é"}'


def test_chunked_answer_and_error_document(serve) -> None:  # type: ignore[no-untyped-def]
    body = b'{"error": {"code": "no_agent", "message": "nothing matched", "candidates": []}}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    server = serve(b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n" + chunked)
    with pytest.raises(RemoteError) as caught:
        DaemonClient(server.path, timeout=10).request("GET", "/v1/x")
    assert caught.value.code == "no_agent" and caught.value.exit_code == 6 and caught.value.http_status == 404


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"cut\": ",  # closed before the body is complete
    b"HTTP/1.1 200 OK\r\ncontent-le",  # closed inside the headers
    b"garbage, not HTTP at all\r\n\r\n",
    b"",  # closed without a word
])
def test_broken_answers_are_unreachable_errors(serve, answer: bytes) -> None:  # type: ignore[no-untyped-def]
    server = serve(answer)
    with pytest.raises(DaemonUnreachable):
        DaemonClient(server.path, timeout=10).request("GET", "/v1/status")


@pytest.mark.parametrize("target", ["/v1/x y", "/v1/x\r\nX-Injected: 1", "v1/no-slash", "/v1/é"])
def test_request_targets_must_be_plain_visible_ascii(tmp_path: Path, target: str) -> None:
    with pytest.raises(ValueError, match="request target"):
        DaemonClient(tmp_path / "none.sock").request("GET", target)
