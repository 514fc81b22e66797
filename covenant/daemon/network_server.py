"""Serve the network-facing listeners (``[webhooks]``, ``[a2a]``) with hypercorn.

These face other machines, so they get a full HTTP/1.1 server with its
timeouts and flow control. The control socket is local and served by the
leaner :mod:`covenant.daemon.server`. hypercorn is imported only when one of
these listeners is configured.
"""

from __future__ import annotations

import socket

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Event, Updated
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext

from covenant.daemon.server import ASGIApp

__all__ = ["serve_network"]


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


async def serve_network(
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
        await _ClosingTCPServer(ASGIWrapper(app), config, context, {}, stream)  # type: ignore[arg-type]

    await trio.serve_listeners(handle, listeners, task_status=task_status)
