"""Serve the control API over unix sockets with hypercorn, knowing each peer's uid.

hypercorn's own ``worker_serve`` reports no client address for AF_UNIX
sockets, and administrative calls must be decided on the peer's credentials
(SO_PEERCRED). So we run hypercorn's per-connection ``TCPServer`` ourselves and
wrap the app once per connection with the peer's credentials, which the app
reads from ``scope["extensions"]["covenant.peer"]``. HTTP parsing stays
hypercorn's; only the accept loop is ours.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Event, Updated
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext

from covenant.errors import ConfigError

__all__ = ["Peer", "bind_unix_socket", "serve", "peer_of"]

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

_UCRED = struct.Struct("3i")


@dataclass(frozen=True)
class Peer:
    """Credentials of the process on the other end of a unix socket."""

    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer | None:
    """SO_PEERCRED of a connected AF_UNIX socket, or None for other families."""
    if sock.family != socket.AF_UNIX:
        return None
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return Peer(pid=pid, uid=uid, gid=gid)


def bind_unix_socket(path: Path, *, mode: int = 0o660) -> socket.socket:
    """Bind and listen on ``path`` with ``mode``, replacing a stale socket file.

    Refuses to replace anything that is not a socket, and refuses a path where a
    live daemon already answers (two daemons on one home would interleave the
    audit log).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"{path}: exists and is not a socket; refusing to replace it (move the file away, or give the "
                              "daemon another path with --socket or COVENANT_SOCKET)")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            os.unlink(path)  # stale: nobody listens
        else:
            raise ConfigError(f"{path}: another daemon is already listening there (`covenant status` shows it; stop it "
                              "first, or give this one another path with --socket)")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # umask-free: bind creates the file with the process umask, so fix the mode right after.
    sock.bind(str(path))
    os.chmod(path, mode)
    sock.listen(512)
    return sock


class _PeerApp:
    """hypercorn AppWrapper that hands the peer's credentials to the ASGI app."""

    def __init__(self, app: ASGIApp, peer: Peer | None) -> None:
        self._app = app
        self._peer = peer

    async def __call__(self, scope: dict, receive: Any, send: Any, sync_spawn: Any, call_soon: Any) -> None:
        scope = dict(scope)
        scope["extensions"] = {**(scope.get("extensions") or {}), "covenant.peer": self._peer}
        await self._app(scope, receive, send)


class _ClosingTCPServer(TCPServer):
    """hypercorn's connection handler, minus a linger after the client hangs up.

    hypercorn (0.17/0.18, trio) arms a connection's keep-alive timer whenever a
    response completes, even when the client has already hung up: the task and
    its socket then live on until the timer fires (30 s). That happens when the
    client closes with part of the response unread (the read side sees
    ECONNRESET, so h11 never learns of the close) while the response task is
    between its last write and the keep-alive reset -- a window that a loaded
    machine hits often. Once the read loop has ended no further request can
    come, so from then on the timer is neither left running nor re-armed, and
    the connection closes as soon as the response in progress is done.
    """

    _client_gone = False

    async def _read_data(self) -> None:
        await super()._read_data()
        self._client_gone = True
        await self.idle_task.stop()

    async def protocol_send(self, event: Event) -> None:
        if self._client_gone and isinstance(event, Updated) and event.idle:
            return  # keep-alive for a client that hung up: nothing to wait for
        await super().protocol_send(event)


def _hypercorn_config() -> HypercornConfig:
    config = HypercornConfig()
    config.keep_alive_timeout = 30
    config.graceful_timeout = 5
    config.accesslog = None
    config.errorlog = None
    return config


async def serve(
    app: ASGIApp,
    sockets: list[socket.socket],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections on ``sockets`` forever; cancel the caller's scope to stop."""
    config = _hypercorn_config()
    context = WorkerContext(None)
    listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(s)) for s in sockets]

    async def handle(stream: trio.SocketStream) -> None:
        peer = peer_of(stream.socket)  # type: ignore[arg-type]
        await _ClosingTCPServer(_PeerApp(app, peer), config, context, {}, stream)  # type: ignore[arg-type]

    await trio.serve_listeners(handle, listeners, task_status=task_status)
