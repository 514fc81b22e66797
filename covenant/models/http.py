"""HTTP/1.1 to one model provider, on trio with h11, with a small pool of kept-alive connections.

Why not httpx: its connection pool (httpcore) walks every connection for every request it
assigns, so with a hundred calls in flight the daemon spent seconds of CPU per round in
``is_idle`` (docs/performance.md, "Model gateway"). Provider calls need little of a general
client: one origin, POST with a JSON body, a plain or streamed answer. Here the pool is a stack
of idle connections (the most recently used first, the least likely to have been closed by the
server) and a semaphore of ``max_connections``; taking or returning a connection is O(1).

Timeouts are the caller's (the gateway wraps each attempt in ``trio.fail_after``). No proxies,
no redirects, no cookies, no credentials but the headers the caller passes. Every failure to
reach the provider or to read its answer is a :class:`TransportError`.
"""

from __future__ import annotations

import select
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import trio

__all__ = ["ProviderHttp", "HttpResponse", "TransportError", "ProviderImpostor", "PeerGuard", "MAX_RESPONSE_BYTES"]

MAX_RESPONSE_BYTES = 32 * 1024 * 1024
"""The most of one answer's body read from a provider (a hostile one must not fill the daemon's memory)."""

_RECV = 65536
_USER_AGENT = "covenant-model-gateway"


class TransportError(Exception):
    """The provider could not be reached, or the connection failed before the answer was complete."""


class ProviderImpostor(TransportError):
    """The connection's other end is a process the daemon must not trust with the key (an agent's)."""


PeerGuard = Callable[[trio.socket.SocketType], Awaitable[str | None]]
"""Asked of every new TCP connection before a byte is sent on it: why it must not be used, or None."""


@dataclass
class _Connection:
    stream: trio.abc.Stream
    h11: h11.Connection
    socket: trio.socket.SocketType
    eof: bool = False

    def looks_closed(self) -> bool:
        """An idle connection the server has since closed (or written to) is readable: do not reuse it."""
        try:
            readable, _, _ = select.select([self.socket.fileno()], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


class HttpResponse:
    """A response whose head has arrived; read its body with :meth:`chunk` or :meth:`aread`."""

    def __init__(self, connection: _Connection, head: h11.Response, max_bytes: int) -> None:
        self.status = head.status_code
        self.headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in head.headers}
        self._connection = connection
        self._read = 0
        self._max_bytes = max_bytes
        self.complete = False

    async def chunk(self) -> bytes | None:
        """The next piece of the body, or None once it has all arrived."""
        if self.complete:
            return None
        while True:
            event = await _next_event(self._connection)
            if isinstance(event, h11.Data):
                self._read += len(event.data)
                if self._read > self._max_bytes:
                    raise TransportError(f"the answer is larger than {self._max_bytes} bytes")
                if event.data:
                    return bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.complete = True
                return None
            else:
                raise TransportError("the connection closed before the answer was complete")

    async def aread(self) -> bytes:
        parts = []
        while (piece := await self.chunk()) is not None:
            parts.append(piece)
        return b"".join(parts)


async def _next_event(connection: _Connection) -> object:
    conn = connection.h11
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            if conn.their_state is h11.ERROR and connection.eof:
                raise TransportError(f"the connection closed before the answer was complete ({exc})") from None
            raise TransportError(f"the provider's HTTP is malformed: {exc}") from None
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await connection.stream.receive_some(_RECV)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            raise TransportError(f"connection lost: {exc or type(exc).__name__}") from None
        connection.eof = not data
        conn.receive_data(data)


class ProviderHttp:
    """Kept-alive HTTP/1.1 connections to one ``http://`` or ``https://`` origin.

    Example::

        http = ProviderHttp("https://api.openai.com/v1", max_connections=100)
        async with http.post("/v1/chat/completions", headers, body) as response:
            data = await response.aread()
        await http.aclose()
    """

    def __init__(self, base_url: str, *, max_connections: int, max_response_bytes: int = MAX_RESPONSE_BYTES,
                 peer_guard: PeerGuard | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r} is not an http:// or https:// URL")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self._host_header = parts.netloc.rsplit("@", 1)[-1]
        self._slots = trio.Semaphore(max_connections)
        self._max_response_bytes = max_response_bytes
        self._idle: list[_Connection] = []
        self._ssl: ssl.SSLContext | None = None
        self._closed = False
        self._peer_guard = peer_guard

    def _ssl_context(self) -> ssl.SSLContext:
        # The system's CA store; OpenSSL's SSL_CERT_FILE / SSL_CERT_DIR in the daemon's
        # environment point it elsewhere (a private CA in front of a local server).
        if self._ssl is None:
            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
            self._ssl = context
        return self._ssl

    async def _connect(self) -> _Connection:
        try:
            tcp = await trio.open_tcp_stream(self.host, self.port)
        except OSError as exc:
            raise TransportError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        if self._peer_guard is not None:
            try:
                refusal = await self._peer_guard(tcp.socket)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await tcp.aclose()
                raise
            if refusal is not None:
                with trio.CancelScope(shield=True):
                    await tcp.aclose()
                raise ProviderImpostor(f"{self.host}:{self.port}: {refusal}; nothing was sent")
        stream: trio.abc.Stream = tcp
        if self.tls:
            tls = trio.SSLStream(tcp, self._ssl_context(), server_hostname=self.host, https_compatible=True)
            try:
                await tls.do_handshake()
            except BaseException as exc:
                with trio.CancelScope(shield=True):
                    await tcp.aclose()
                if isinstance(exc, (trio.BrokenResourceError, ssl.SSLError, OSError)):
                    raise TransportError(f"TLS with {self.host}:{self.port} failed: {exc.__cause__ or exc}") from None
                raise
            stream = tls
        return _Connection(stream, h11.Connection(h11.CLIENT), tcp.socket)

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.looks_closed():
                return connection
            _close_now(connection)
        return None

    @asynccontextmanager
    async def post(self, target: str, headers: dict[str, str], body: bytes) -> AsyncIterator[HttpResponse]:
        """Send one POST and yield the response once its head arrived.

        A connection whose answer was read to the end goes back to the pool; any other is closed.
        A kept-alive connection that turns out dead before any of the answer arrived is replaced
        by a new one once (the server closed it while idle; the request never reached it).
        """
        if self._closed:
            raise TransportError("the provider's client is closed")
        async with self._slots:
            connection = self._take_idle()
            reused = connection is not None
            while True:
                if connection is None:
                    connection = await self._connect()
                try:
                    head = await self._exchange(connection, target, headers, body)
                    break
                except TransportError:
                    await _aclose(connection)
                    if not reused:
                        raise
                    connection, reused = None, False
                except BaseException:  # cancelled mid-request: the connection is in no state to reuse
                    await _aclose(connection)
                    raise
            response = HttpResponse(connection, head, self._max_response_bytes)
            try:
                yield response
            except BaseException:
                await _aclose(connection)
                raise
            conn = connection.h11
            if response.complete and conn.our_state is h11.DONE and conn.their_state is h11.DONE and not self._closed:
                conn.start_next_cycle()
                self._idle.append(connection)
            else:
                await _aclose(connection)

    async def _exchange(self, connection: _Connection, target: str, headers: dict[str, str], body: bytes) -> h11.Response:
        conn = connection.h11
        request = h11.Request(
            method="POST",
            target=target,
            headers=[("host", self._host_header), ("user-agent", _USER_AGENT),
                     ("content-length", str(len(body))), *headers.items()],
        )
        try:
            data = conn.send(request) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError as exc:
            raise TransportError(f"the request cannot be sent as HTTP/1.1: {exc}") from None
        try:
            await connection.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            raise TransportError(f"connection lost: {exc or type(exc).__name__}") from None
        while True:
            event = await _next_event(connection)
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.InformationalResponse):
                continue
            raise TransportError("the connection closed before the answer's head arrived")

    async def aclose(self) -> None:
        """Close the idle connections; ones in use close when their call ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await _aclose(connection)


async def _aclose(connection: _Connection) -> None:
    with trio.CancelScope(shield=True):
        try:
            await connection.stream.aclose()
        except (trio.BrokenResourceError, OSError, ssl.SSLError):
            pass


def _close_now(connection: _Connection) -> None:
    """Drop a dead idle connection without awaiting (its TLS close-notify would go nowhere)."""
    try:
        connection.socket.close()
    except OSError:
        pass
