"""HTTP/1.1 over unix sockets for the replica API and the gateway, on trio with h11.

A replica must start fast and stay small (goals: healthy in 300 ms, 30 MB
idle), so it uses neither hypercorn nor httpx: h11 (the maintained sans-IO
parser hypercorn itself uses) drives both ends here. JSON bodies; a streamed
answer is ``text/event-stream`` with ``event:`` and one-line ``data:`` JSON
per event.

Server: :func:`serve` with a handler returning :class:`JSONResponse` or
:class:`EventStream`; it answers any number of requests on a connection
(HTTP/1.1 keep-alive) and checks the peer before each. Client: :func:`call`
(JSON) and :func:`stream` (events), one connection per request, or kept
alive in a :class:`ConnectionPool` (the daemon's invokes of one replica life,
a replica's calls to its gateway): 100 sessions at once otherwise cost the
daemon two connects, accepts and closes per dispatch.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import h11
import trio

from covenant import outside_json
from covenant.ratelimit import TokenBucket
from covenant.sse import SseEvent, SseParser

log = logging.getLogger("covenant.rune")

__all__ = [
    "Request",
    "JSONResponse",
    "EventStream",
    "WireError",
    "NotThePeer",
    "ConnectionPool",
    "bind_socket",
    "serve",
    "call",
    "stream",
    "sse_frame",
]

MAX_BODY_BYTES = 8 * 1024 * 1024
_RECV = 65536


class WireError(Exception):
    """The peer could not be reached, closed early or answered something unreadable."""


class NotThePeer(WireError):
    """The socket is served by another process than the one expected: not that peer at all."""


@dataclass
class Request:
    method: str
    target: str
    body: Any
    """The JSON body (None when empty)."""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class JSONResponse:
    status: int
    document: Any


Emit = Callable[[str, Any], Awaitable[None]]


@dataclass
class EventStream:
    """A streamed answer: ``producer(emit)`` calls ``await emit(event, data)`` per event."""

    producer: Callable[[Emit], Awaitable[None]]


Handler = Callable[[Request], Awaitable["JSONResponse | EventStream"]]


def sse_frame(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def bind_socket(path: Path) -> socket.socket:
    """Listen on ``path``, mode 0600 (a stale socket file is replaced; anything else is refused).

    The mode comes from the umask at ``bind``, never from a ``chmod`` after it: the folder is the agent
    uid's, and a process of that uid could put a symlink at ``path`` between the two, which ``chmod``
    (run as root) would follow.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(f"{path}: exists and is not a socket; refusing to replace it")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


async def _send(stream: trio.SocketStream, conn: h11.Connection, event: Any) -> None:
    data = conn.send(event)
    if data:
        await stream.send_all(data)


async def _next_event(stream: trio.SocketStream, conn: h11.Connection) -> Any:
    """The connection's next h11 event, reading from ``stream`` while h11 needs data."""
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await stream.receive_some(_RECV))
    return event


async def _read_request(stream: trio.SocketStream, conn: h11.Connection) -> Request | None:
    head: h11.Request | None = None
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await _next_event(stream, conn)
        if isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_BODY_BYTES:
                raise WireError(f"request body over {MAX_BODY_BYTES} bytes")
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            break
        elif isinstance(event, h11.ConnectionClosed):
            return None
    assert head is not None
    raw = b"".join(chunks)
    body = outside_json.loads(raw) if raw.strip() else None
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
    return Request(head.method.decode("ascii"), head.target.decode("latin-1"), body, headers)


async def _answer(stream: trio.SocketStream, conn: h11.Connection, answer: JSONResponse | EventStream) -> None:
    if isinstance(answer, JSONResponse):
        body = json.dumps(answer.document, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
        head = conn.send(h11.Response(status_code=answer.status, headers=headers)) or b""
        await stream.send_all(head + (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b""))
        return
    # h11 frames it (chunked) and says ``connection: close`` itself when the client asked for that.
    headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
    await _send(stream, conn, h11.Response(status_code=200, headers=headers))

    sending = trio.Lock()  # the calls of one turn run at once, and each emits its tool_start and tool_done

    async def emit(event: str, data: Any) -> None:
        async with sending:
            await _send(stream, conn, h11.Data(data=sse_frame(event, data)))

    await answer.producer(emit)
    await _send(stream, conn, h11.EndOfMessage())


_UCRED = struct.Struct("3i")


def _peer_pid(stream: trio.SocketStream) -> int | None:
    try:
        raw = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    return _UCRED.unpack(raw)[0]


async def _handle(stream: trio.SocketStream, handler: Handler, still_the_peer: Callable[[], bool]) -> None:
    """Answer the requests of one connection, one after the other, until the client closes it.

    The peer was checked at accept; ``still_the_peer()`` is asked again before each later request, so a
    connection kept alive across a change of the process this socket serves (a replica's next life) gets
    the fixed 403 and is closed instead of an answer.
    """
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
    try:
        while True:
            try:
                request = await _read_request(stream, conn)
            except (h11.RemoteProtocolError, WireError, ValueError) as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _answer(stream, conn, JSONResponse(400, {"error": {"code": "bad_request", "message": str(exc)}}))
                return
            if request is None:
                return
            if not still_the_peer():
                await stream.send_all(_REFUSED % (len(_REFUSED_BODY), _REFUSED_BODY))
                return
            try:
                answer = await handler(request)
            except Exception as exc:  # a bug in a handler must not take the server (and its owner) down
                log.exception("request handler failed", extra={"target": request.target})
                answer = JSONResponse(500, {"error": {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}})
            await _answer(stream, conn, answer)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # the client asked to close, or left part of its request unread
            conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
        pass  # the client went away
    finally:
        await stream.aclose()


_REFUSED = (
    b"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
)
_REFUSED_BODY = b'{"error":{"code":"forbidden","message":"this socket serves one process only"}}\n'
_REFUSED_LINGER_S = 0.1
_REFUSED_DRAIN_BYTES = 64 * 1024


async def serve(
    sock: socket.socket,
    handler: Handler,
    *,
    peer_pid: Callable[[], int | None],
    name: str,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer requests on the listening ``sock`` until cancelled; only those of the process ``peer_pid()``.

    Both ends of a replica serve one peer each: the daemon's gateway its
    replica, the replica the daemon. Processes of the agent's uid (its
    tools) can reach both sockets, so a connection from any other process
    (SO_PEERCRED) gets a fixed 403 and is closed before a byte of it is
    read: it cannot hold the server with a request it never finishes, or
    make it buffer a body. Refusals are logged once per process
    (:class:`_Refusals`); ``name`` says which socket in the log.

    A refusal is never a legitimate request, so their rate is bounded
    (a :class:`~covenant.ratelimit.TokenBucket` of 32 at once and 32 a
    second): past it a refused connection is closed
    unanswered and the next accept waits 5 ms. A tool connecting in a loop
    then slows its own agent's socket, not the daemon's event loop
    (``bench/gateway_flood.py``: it had ≈ 960 connections a second answered
    and took ≈ 30 % of a core more; now ≈ 200, ≈ 40 of them answered, and ≈ 6 %).
    """
    listener = trio.socket.from_stdlib_socket(sock)
    refusals, answered = _Refusals(name), TokenBucket(_REFUSALS_PER_S, _REFUSALS_BURST)
    with listener:
        async with trio.open_nursery() as handlers:
            task_status.started()
            while True:
                stream = trio.SocketStream(await _accept(listener))
                expected, found = peer_pid(), _peer_pid(stream)
                if expected is not None and found == expected:
                    handlers.start_soon(_handle, stream, handler, partial(_serves, peer_pid, found))
                    continue
                refusals.note(found, expected)
                if answered.take():
                    handlers.start_soon(_refuse, stream)
                else:
                    stream.socket.close()
                    await trio.sleep(_OVER_BUDGET_PAUSE_S)


def _serves(peer_pid: Callable[[], int | None], found: int) -> bool:
    """Is ``found`` (a connection's peer, read at accept) still the process the socket serves?"""
    return peer_pid() == found


async def _accept(listener: trio.socket.SocketType) -> trio.socket.SocketType:
    """The next connection; out of descriptors or memory, wait and try again (as trio's serve_listeners)."""
    while True:
        try:
            connection, _ = await listener.accept()
            return connection
        except OSError as exc:
            if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                raise
            log.error("accept failed; retrying", extra={"detail": os.strerror(exc.errno), "retry_s": _ACCEPT_RETRY_S})
            await trio.sleep(_ACCEPT_RETRY_S)


_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_RETRY_S = 0.1
_OVER_BUDGET_PAUSE_S = 0.005
_REFUSALS_BURST = 32
_REFUSALS_PER_S = 32


async def _refuse(stream: trio.SocketStream) -> None:
    """Send the fixed 403 and close. What the client already sent is read and dropped first (at most
    64 KiB, for at most 0.1 s): closing a unix socket with unread data resets the peer, which would then
    lose the answer."""
    with trio.move_on_after(_REFUSED_LINGER_S):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await stream.send_all(_REFUSED % (len(_REFUSED_BODY), _REFUSED_BODY))
            await stream.send_eof()
            dropped = 0
            while dropped < _REFUSED_DRAIN_BYTES and (data := await stream.receive_some(_REFUSED_DRAIN_BYTES)):
                dropped += len(data)
    await stream.aclose()


class _Refusals:
    """Log a refused connection once per process, not once per connection: a process that connects in a
    loop would fill the log otherwise. Remembers the last few thousand pids."""

    _REMEMBERED = 4096

    def __init__(self, name: str) -> None:
        self.name = name
        self._seen: dict[int | None, None] = {}

    def note(self, found: int | None, expected: int | None) -> None:
        if found in self._seen:
            return
        if len(self._seen) >= self._REMEMBERED:
            self._seen.clear()
        self._seen[found] = None
        log.warning("connection refused: not the process this socket serves",
                    extra={"socket": self.name, "peer_pid": found, "serves_pid": expected})


# -- client --------------------------------------------------------------------------


_BACKLOG_WAIT_MAX_S = 0.05


async def connect_unix(path: str) -> trio.SocketStream:
    """Connect to the unix socket ``path`` (see :func:`_connect_raw`)."""
    return trio.SocketStream(trio.socket.from_stdlib_socket(await _connect_raw(path)))


async def _connect_raw(path: str) -> socket.socket:
    """Connect to the unix socket ``path``, waiting while its listen backlog is full.

    Not :func:`trio.open_unix_socket`: on Linux a non-blocking connect to a
    unix socket whose backlog is full fails with EAGAIN (other families say
    EINPROGRESS and go on in the background); trio 0.35 takes it for a
    connect in progress and returns the socket unconnected. Its peer then
    reads as pid 0 and its first send fails. A burst of concurrent calls (a
    model turn with many tool calls, many intents at once) fills a backlog
    easily. Here the connect is retried, 1 ms apart at first, then up to
    every 50 ms, for as long as the caller's cancel scope allows.
    """
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.setblocking(False)
    delay = 0.001
    try:
        while True:
            try:
                raw.connect(path)
                break
            except BlockingIOError as exc:
                if exc.errno != errno.EAGAIN:
                    raise
            await trio.sleep(delay)
            delay = min(delay * 2, _BACKLOG_WAIT_MAX_S)
    except BaseException:
        raw.close()
        raise
    return raw


@dataclass
class _Connection:
    """One client connection: the stream, its h11 state, and the plain socket under it (for a peek)."""

    stream: trio.SocketStream
    conn: h11.Connection
    raw: socket.socket
    idle_since: float = 0.0

    def close(self) -> None:
        self.stream.socket.close()


async def _open(path: Path | str, peer_pid: int | None) -> _Connection:
    """A new connection to ``path``; with ``peer_pid``, refused (:class:`NotThePeer`) unless that process serves it."""
    try:
        raw = await _connect_raw(str(path))
    except OSError as exc:
        raise WireError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(raw))
    if peer_pid is not None and (served_by := _peer_pid(stream)) != peer_pid:
        stream.socket.close()
        raise NotThePeer(f"{path} is served by pid {served_by}, not by pid {peer_pid}")
    return _Connection(stream, h11.Connection(h11.CLIENT), raw)


class ConnectionPool:
    """Connections to the socket ``path`` served by the process ``peer_pid``, kept alive between requests.

    A connection is reused only when its last exchange ended cleanly on both sides, and is checked
    before each reuse with a non-blocking peek: one the server closed meanwhile (its process died,
    stopped or restarted) is dropped, and the request goes on a new one. Should the peer close it
    between the peek and the send, the send fails before the server could have read a whole request,
    and the request goes once more on a new connection; once the request was sent, a lost connection
    is an error as it always was, never a silent second try. Every connection, new or reused, is one
    whose peer was checked to be ``peer_pid`` when it was made: the peer of a connected unix socket
    never changes. At most ``max_idle`` are kept, none longer than ``idle_s`` unused; :meth:`close`
    closes them all (the owner's peer is gone), and those in use are closed when they come back.
    """

    def __init__(self, path: Path | str, peer_pid: int | None, *, max_idle: int = 128, idle_s: float = 60.0) -> None:
        self.path = path
        self.peer_pid = peer_pid
        self.max_idle = max_idle
        self.idle_s = idle_s
        self.closed = False
        self.opened = 0
        """Connections this pool made (a figure for tests and benchmarks: reuse shows as fewer)."""
        self._idle: list[_Connection] = []  # a stack: the most recently used is reused first

    def idle_count(self) -> int:
        return len(self._idle)

    def take(self) -> _Connection | None:
        """A kept connection that is still open and silent, or None."""
        while self._idle:
            kept = self._idle.pop()
            if _still_open(kept.raw):
                return kept
            kept.close()
        return None

    def give_back(self, kept: _Connection) -> None:
        """Keep ``kept`` for the next request if its exchange is complete; close it otherwise."""
        conn = kept.conn
        if self.closed or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            kept.close()
            return
        conn.start_next_cycle()
        now = trio.current_time()
        kept.idle_since = now
        self._idle.append(kept)
        while self._idle and (len(self._idle) > self.max_idle or now - self._idle[0].idle_since > self.idle_s):
            self._idle.pop(0).close()

    def close(self) -> None:
        self.closed = True
        while self._idle:
            self._idle.pop().close()


def _still_open(raw: socket.socket) -> bool:
    """True when an idle connection has nothing to read: the server neither closed it nor sent anything."""
    try:
        raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # b"": closed; any byte: not an answer we asked for
    except BlockingIOError:
        return True
    except OSError:
        pass
    return False


def _request_bytes(conn: h11.Connection, method: str, target: str, body: Any, accept: str, keep_alive: bool) -> bytes:
    payload = b"" if body is None else json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    headers = [
        ("host", "localhost"),
        ("accept", accept),
        ("content-type", "application/json"),
        ("content-length", str(len(payload))),
    ]
    if not keep_alive:
        headers.append(("connection", "close"))
    data = conn.send(h11.Request(method=method, target=target, headers=headers)) or b""
    if payload:
        data += conn.send(h11.Data(data=payload)) or b""
    return data + (conn.send(h11.EndOfMessage()) or b"")


async def _send_request(
    path: Path | str, method: str, target: str, body: Any, accept: str, peer_pid: int | None, pool: ConnectionPool | None
) -> _Connection:
    """The request sent on a kept connection of ``pool`` or a new one; returns that connection."""
    kept = pool.take() if pool is not None else None
    if kept is not None:
        try:
            await kept.stream.send_all(_request_bytes(kept.conn, method, target, body, accept, True))
            return kept
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            kept.close()  # closed by the peer after the peek: the server never had the whole request
        except BaseException:
            kept.close()
            raise
    fresh = await _open(path, peer_pid)
    if pool is not None:
        pool.opened += 1
    try:
        await fresh.stream.send_all(_request_bytes(fresh.conn, method, target, body, accept, pool is not None))
    except BaseException as exc:
        fresh.close()
        if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError, OSError)):
            raise WireError(f"{path}: connection lost: {exc}") from None
        raise
    return fresh


@asynccontextmanager
async def _exchange(
    path: Path | str, method: str, target: str, body: Any, accept: str, peer_pid: int | None,
    pool: ConnectionPool | None,
) -> AsyncIterator[tuple[h11.Response, h11.Connection, trio.SocketStream]]:
    if pool is not None:
        path, peer_pid = pool.path, pool.peer_pid
    connection = await _send_request(path, method, target, body, accept, peer_pid, pool)
    complete = False
    try:
        try:
            while True:
                event = await _next_event(connection.stream, connection.conn)
                if isinstance(event, h11.Response):
                    break
                if isinstance(event, h11.ConnectionClosed):
                    raise WireError(f"{path}: the peer closed the connection without answering")
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, OSError) as exc:
            raise WireError(f"{path}: connection lost: {exc}") from None
        yield event, connection.conn, connection.stream
        complete = True
    finally:
        if complete and pool is not None:
            pool.give_back(connection)
        else:
            connection.close()


async def _body_events(conn: h11.Connection, stream: trio.SocketStream) -> AsyncIterator[bytes]:
    try:
        while True:
            event = await _next_event(stream, conn)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise WireError("the peer closed the connection before its answer was complete")
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, OSError) as exc:
        raise WireError(f"connection lost while reading the answer: {exc}") from None


async def _whole_body(path: Path | str, conn: h11.Connection, stream: trio.SocketStream) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in _body_events(conn, stream):
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise WireError(f"{path}: an answer over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def call(
    path: Path | str, method: str, target: str, body: Any = None, *, peer_pid: int | None = None,
    pool: ConnectionPool | None = None,
) -> tuple[int, Any]:
    """One JSON request; returns (status, decoded JSON body). With ``peer_pid``, a socket served by any
    other process raises :class:`NotThePeer` before anything is sent. With ``pool``, on a connection it
    keeps (its path and peer are used, not ``path`` and ``peer_pid``)."""
    async with _exchange(path, method, target, body, "application/json", peer_pid, pool) as (response, conn, stream):
        raw = await _whole_body(path, conn, stream)
    try:
        return response.status_code, (outside_json.loads(raw) if raw.strip() else None)
    except ValueError:
        raise WireError(f"{path}: HTTP {response.status_code} with a body that is not JSON") from None


def _event_data(path: Path | str, event: SseEvent) -> Any:
    try:
        return outside_json.loads(event.data)
    except ValueError:
        raise WireError(f"{path}: a {event.event!r} event whose data is not JSON") from None


async def stream(
    path: Path | str, target: str, body: Any, *, peer_pid: int | None = None, pool: ConnectionPool | None = None
) -> AsyncIterator[tuple[str, Any]]:
    """POST ``body`` asking for events; yields ``(event, data)``; ``peer_pid`` and ``pool`` as for :func:`call`.
    The connection goes back to ``pool`` only when the stream was read to its end.

    A JSON (non-stream) answer is yielded once as ``("response", {"status", "document"})``. One
    event (or that answer) may be at most :data:`MAX_BODY_BYTES`.
    """
    async with _exchange(path, "POST", target, body, "text/event-stream", peer_pid, pool) as (response, conn, sock):
        content_type = dict(response.headers).get(b"content-type", b"").decode("latin-1")
        if not content_type.startswith("text/event-stream"):
            raw = await _whole_body(path, conn, sock)
            try:
                document = outside_json.loads(raw) if raw.strip() else None
            except ValueError:
                raise WireError(f"{path}: HTTP {response.status_code} with a body that is not JSON") from None
            yield "response", {"status": response.status_code, "document": document}
            return
        parser = SseParser()
        unfinished = 0
        """Bytes read since an event last completed: one event's bound."""
        async for chunk in _body_events(conn, sock):
            events = parser.feed(chunk)
            unfinished = 0 if events else unfinished + len(chunk)
            if unfinished > MAX_BODY_BYTES:
                raise WireError(f"{path}: an event over {MAX_BODY_BYTES} bytes")
            for event in events:
                yield event.event, _event_data(path, event)
        for event in parser.end():
            yield event.event, _event_data(path, event)
