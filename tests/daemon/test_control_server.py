"""The control socket's HTTP/1.1 server, driven in-process over real unix sockets.

Keep-alive and pipelining, ``Expect: 100-continue`` (curl sends it for bodies
over 1 KiB), malformed requests, streamed (chunked) answers, the peer's
credentials, and what an app sees when its client hangs up: ``send`` raises
ClientGone and ``receive`` says ``http.disconnect``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from functools import partial
from pathlib import Path

import pytest
import trio

from covenant.daemon.server import ClientGone, ReadTimeouts, bind_unix_socket, serve

class _App:
    """Echoes the request; ``/stream`` answers in three chunks; ``/wait`` waits for the client to leave."""

    def __init__(self) -> None:
        self.seen_gone = trio.Event()
        self.seen_disconnect = trio.Event()

    async def __call__(self, scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        body = b""
        while scope["path"] != "/ignore":
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/ignore":  # answers before reading the body, as the API does for an unknown path
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"3")]})
            await send({"type": "http.response.body", "body": b"no\n"})
            return
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for part in (b"one ", b"two ", b"three"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["path"] == "/wait":
            assert (await receive())["type"] == "http.disconnect"
            self.seen_disconnect.set()
            try:
                await send({"type": "http.response.start", "status": 200, "headers": []})
                for _ in range(1000):
                    await send({"type": "http.response.body", "body": b"x" * 4096, "more_body": True})
            except ClientGone:
                self.seen_gone.set()
            return
        peer = scope["extensions"]["covenant.peer"]
        document = {"method": scope["method"], "path": scope["path"], "query": scope["query_string"].decode(),
                    "body": body.decode(), "uid": peer.uid, "pid": peer.pid}
        data = json.dumps(document).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


def _exchange(path: Path, data: bytes, *, until: bytes) -> bytes:
    """Send raw bytes on one connection and read until ``until`` has been seen (or EOF)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(path))
        client.sendall(data)
        got = b""
        while until not in got:
            chunk = client.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def _continue_then_body(path: Path) -> bytes:
    """Send a head asking for 100-continue, wait for it (the body is not sent before), then the body."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(20)
        client.connect(str(path))
        client.sendall(b"POST /c HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n")
        interim = client.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 "), interim
        client.sendall(b"abc")
        got = b""
        while b'"abc"' not in got:
            got += client.recv(65536)
        return got


async def _serving(nursery: trio.Nursery, tmp_path: Path, app: _App) -> Path:
    path = tmp_path / "s.sock"
    await nursery.start(serve, app, [bind_unix_socket(path)])
    return path


@pytest.mark.skipif(not shutil.which("curl") and not os.environ.get("CI"), reason="curl is not installed")
async def test_keep_alive_pipelining_peer_credentials_and_curl(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        path = await _serving(nursery, tmp_path, _App())
        two = (b"GET /a?x=1 HTTP/1.1\r\nhost: x\r\n\r\n"
               b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello")
        got = await trio.to_thread.run_sync(lambda: _exchange(path, two, until=b'"hello"'))
        first, second = got.split(b"HTTP/1.1 200 ")[1:]
        assert b'"path": "/a"' in first and b'"query": "x=1"' in first
        assert b'"method": "POST"' in second and b'"body": "hello"' in second
        assert f'"uid": {os.getuid()}'.encode() in first and f'"pid": {os.getpid()}'.encode() in first
        assert b'"body": "abc"' in await trio.to_thread.run_sync(_continue_then_body, path)
        body = json.dumps({"text": "y" * 4000})  # > 1 KiB: curl asks for 100-continue first
        done = await trio.to_thread.run_sync(lambda: subprocess.run(
            ["curl", "-sS", "--max-time", "20", "--unix-socket", str(path), "-H", "content-type: application/json",
             "--data", body, "http://covenant/v1/dispatch"], capture_output=True, text=True))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["body"] == body
        nursery.cancel_scope.cancel()


async def test_a_streamed_answer_is_chunked_and_a_malformed_request_gets_400(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        path = await _serving(nursery, tmp_path, _App())
        got = await trio.to_thread.run_sync(lambda: _exchange(
            path, b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n", until=b"0\r\n\r\n"))
        assert b"transfer-encoding: chunked" in got.lower()
        assert got.endswith(b"4\r\none \r\n4\r\ntwo \r\n5\r\nthree\r\n0\r\n\r\n")
        bad = await trio.to_thread.run_sync(lambda: _exchange(path, b"NOT HTTP AT ALL\r\n\r\n", until=b"\n}\n"))
        assert bad.startswith(b"HTTP/1.1 400 ")
        error = json.loads(bad.split(b"\r\n\r\n", 1)[1])["error"]  # the API's error document, valid JSON
        assert error["code"] == "bad_request" and error["message"].startswith("malformed HTTP request")
        huge = b"GET / HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 100_000 + b"\r\n\r\n"  # a head past h11's 16 KiB
        refused = await trio.to_thread.run_sync(lambda: _exchange(path, huge, until=b"\n}\n"))
        assert refused.startswith(b"HTTP/1.1 431 ")
        post = b"POST /ignore HTTP/1.1\r\nhost: x\r\ncontent-length: 300000\r\n\r\n" + b"b" * 300_000
        ignored = await trio.to_thread.run_sync(lambda: _exchange(path, post, until=b"no\n"))
        assert ignored.startswith(b"HTTP/1.1 404 ") and ignored.endswith(b"no\n")
        assert b"connection: close" in ignored.lower()  # answered before its body: the body is refused
        nursery.cancel_scope.cancel()


async def test_an_app_learns_that_its_client_hung_up(tmp_path: Path) -> None:
    app = _App()
    async with trio.open_nursery() as nursery:
        path = await _serving(nursery, tmp_path, app)
        client = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await client.connect(str(path))
        await client.send(b"GET /wait HTTP/1.1\r\nhost: x\r\n\r\n")
        await trio.sleep(0.05)
        client.close()
        with trio.fail_after(20):
            await app.seen_disconnect.wait()
            await app.seen_gone.wait()
        nursery.cancel_scope.cancel()


def _until_closed(path: Path, data: bytes) -> bytes:
    """Send ``data`` on one connection, then read until the server closes it (a 20 s timeout fails the test)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(20)
        client.connect(str(path))
        client.sendall(data)
        got = b""
        while chunk := client.recv(65536):
            got += chunk
        return got


async def test_slow_heads_and_bodies_are_closed_unanswered_and_idle_connections_quietly(tmp_path: Path) -> None:
    app = _App()
    closed: list[str] = []
    path = tmp_path / "s.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, timeouts=ReadTimeouts(head_s=0.5, body_s=0.5), on_closed=closed.append),
                            app, [bind_unix_socket(path)])
        # Each a deadline for the whole head or body: the client never finishes either.
        head = await trio.to_thread.run_sync(_until_closed, path, b"GET /a HTTP/1.1\r\nhost: x\r\n")
        body = await trio.to_thread.run_sync(_until_closed, path,
                                             b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 9\r\n\r\nabc")
        assert (head, body) == (b"", b"")
        assert closed == ["header_timeout", "body_timeout"]
        # A kept-alive connection that is served and then sends nothing is closed as well, without counting.
        served = await trio.to_thread.run_sync(_until_closed, path, b"GET /c HTTP/1.1\r\nhost: x\r\n\r\n")
        assert served.startswith(b"HTTP/1.1 200 ") and b'"path": "/c"' in served
        assert closed == ["header_timeout", "body_timeout"]
        nursery.cancel_scope.cancel()
