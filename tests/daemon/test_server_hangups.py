"""Clients that hang up mid-response must not leave their connection behind.

The control server runs hypercorn's connection handler. When a client closes
with part of the response still unread, the server's read side sees
ECONNRESET rather than an orderly end of stream, so HTTP/1.1 keep-alive
bookkeeping never learns that the client is gone; if the response task then
completes, hypercorn arms its 30 s keep-alive timer for a connection nobody
will use. A loaded machine hits that window often, which made the daemon's
end-to-end fd test flaky. This test drives the real server in-process with
real unix sockets and clients that read only the response head.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import psutil
import trio

from covenant.daemon.server import bind_unix_socket, serve

CLIENTS = 300


async def _app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"ok": true}' * 50})


def _open_server_connections(path: Path) -> int:
    """Accepted connections still open on ``path`` (the listening socket excluded)."""
    ours = [c for c in psutil.Process().net_connections(kind="unix") if c.laddr == str(path)]
    return len(ours) - 1


def _hang_up_after_head(path: Path) -> None:
    for _ in range(CLIENTS):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(path))
        client.sendall(b"GET /v1/status HTTP/1.1\r\nhost: x\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += client.recv(65536)
        assert head.startswith(b"HTTP/1.1 200")
        client.close()  # the body may still be unread: the server then sees ECONNRESET


async def test_connections_close_when_clients_hang_up_mid_response(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    listener = bind_unix_socket(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, _app, [listener])
        await trio.to_thread.run_sync(_hang_up_after_head, path)
        # Without the fix some connections stay open for the whole 30 s keep-alive time;
        # with it they close as soon as their response is done. 20 s only bounds a broken run.
        deadline = time.monotonic() + 20
        while (left := await trio.to_thread.run_sync(_open_server_connections, path)) > 0:
            assert time.monotonic() < deadline, f"{left} connections outlived their clients"
            await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
