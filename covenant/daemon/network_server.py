"""Serve the network-facing listeners (``[webhooks]``, ``[a2a]``): covenant's HTTP/1.1 server behind
connection caps.

Anyone who can reach the port can open connections, so each listener bounds what a client may hold
(:class:`~covenant.triggers.webhook_config.ListenerLimits`): at most ``max_connections`` open at once
from everyone and ``max_connections_per_source`` from one address; a connection past either is closed
as soon as it is accepted, before a byte of it is read (accepting it is what keeps the kernel's backlog
free for everyone else). A connection that is let in has ``header_timeout_s`` to send a whole request
head and ``body_timeout_s`` for its body (:class:`~covenant.daemon.server.ReadTimeouts`), so a client
trickling bytes holds its place for a bounded time only. Every refusal and timeout is counted
(``covenant_listener_closed_total``) and logged at most once a minute per listener and reason.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from covenant.daemon.server import ASGIApp, ReadTimeouts, serve_connection
from covenant.triggers.webhook_config import ListenerLimits

__all__ = ["ListenerObserver", "serve_network"]

log = logging.getLogger("covenant.daemon")

_LOG_EVERY_S = 60.0
_OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_RETRY_S = 0.1
_ACCEPT_BATCH = 64
_GAVE_UP = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ENETDOWN, errno.ENOPROTOOPT,
                      errno.EHOSTDOWN, errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP, errno.ENETUNREACH})
"""accept(2) errors of a connection that went away before it was accepted (trio's own list)."""


class ListenerObserver(Protocol):
    """Where a listener's refusals and open connections are counted (:class:`covenant.daemon.metrics.Metrics`)."""

    def listener_closed(self, listener: str, reason: str) -> None: ...

    def listener_open(self, listener: str, connections: int) -> None: ...


@dataclass
class _Gate:
    """The open connections of one listener, in all and per source address, and when refusals were last logged."""

    name: str
    limits: ListenerLimits
    observer: ListenerObserver | None
    clock: Callable[[], float]
    open: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    unlogged: dict[str, int] = field(default_factory=dict)
    logged_at: dict[str, float] = field(default_factory=dict)

    def admit(self, source: str) -> bool:
        """Take a place for a connection from ``source``; False (counted) when a cap is reached."""
        if self.open >= self.limits.max_connections:
            self.closed("connection_cap")
            return False
        if self.by_source.get(source, 0) >= self.limits.max_connections_per_source:
            self.closed("source_cap")
            return False
        self.open += 1
        self.by_source[source] = self.by_source.get(source, 0) + 1
        self._report_open()
        return True

    def leave(self, source: str) -> None:
        self.open -= 1
        left = self.by_source[source] - 1
        if left:
            self.by_source[source] = left
        else:
            del self.by_source[source]
        self._report_open()

    def closed(self, reason: str) -> None:
        """A connection closed unserved: counted, and logged with the others of the last minute."""
        if self.observer is not None:
            self.observer.listener_closed(self.name, reason)
        self.unlogged[reason] = self.unlogged.get(reason, 0) + 1
        now = self.clock()
        if now - self.logged_at.get(reason, -_LOG_EVERY_S) >= _LOG_EVERY_S:
            self.logged_at[reason] = now
            log.warning("listener closed connections unserved", extra={
                "listener": self.name, "reason": reason, "connections": self.unlogged.pop(reason),
                "open": self.open, "sources": len(self.by_source)})

    def _report_open(self) -> None:
        if self.observer is not None:
            self.observer.listener_open(self.name, self.open)


def _source(address: object) -> str:
    """The part of a peer's address a per-source cap counts: its IP address (the whole address otherwise)."""
    return str(address[0]) if isinstance(address, tuple) else str(address)


async def serve_network(
    app: ASGIApp,
    sockets: list[socket.socket],
    *,
    name: str,
    limits: ListenerLimits,
    observer: ListenerObserver | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections on ``sockets`` (listener ``name``, e.g. ``webhooks``) forever, within ``limits``;
    cancel the caller's scope to stop."""
    gate = _Gate(name, limits, observer, trio.current_time)
    timeouts = ReadTimeouts(float(limits.header_timeout_s), float(limits.body_timeout_s))

    async def handle(stream: trio.SocketStream, source: str, client: tuple[str, int] | None) -> None:
        try:
            await serve_connection(stream, app, timeouts=timeouts, on_closed=gate.closed, client=client)
        finally:
            gate.leave(source)

    async def accept_loop(listener: socket.socket, nursery: trio.Nursery) -> None:
        # Accepted in batches straight from the kernel, and a refused connection closed without ever being
        # wrapped for trio: one reconnecting over its cap in a loop costs ~1/3 of what trio's accept per
        # connection did (bench/listener_flood.py).
        listener.setblocking(False)
        while True:
            await trio.lowlevel.wait_readable(listener)
            for _ in range(_ACCEPT_BATCH):
                try:
                    conn, address = listener.accept()
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno in _GAVE_UP:
                        continue  # the client left before its connection was accepted
                    if exc.errno not in _OUT_OF_FDS:
                        raise
                    gate.closed("out_of_fds")
                    await trio.sleep(_ACCEPT_RETRY_S)
                    break
                source = _source(address)
                if not gate.admit(source):
                    conn.close()
                    continue
                client = (str(address[0]), int(address[1])) if isinstance(address, tuple) else None
                nursery.start_soon(handle, trio.SocketStream(trio.socket.from_stdlib_socket(conn)), source, client)
            await trio.lowlevel.checkpoint()  # a steady flood of connections never starves the other tasks

    async with trio.open_nursery() as nursery:
        for sock in sockets:
            nursery.start_soon(accept_loop, sock, nursery)
        task_status.started()
