"""HTTP/1.1 over unix sockets for the replica API and the gateway, on trio with h11.

A replica must start fast and stay small (goals: healthy in 300 ms, 30 MB
idle), so it uses neither hypercorn nor httpx: h11 (the maintained sans-IO
parser hypercorn itself uses) drives both ends here. One request per
connection (``Connection: close``): every call is local and the connection
costs microseconds. JSON bodies; a streamed answer is ``text/event-stream``
with ``event:`` and one-line ``data:`` JSON per event.

Server: :func:`serve` with a handler returning :class:`JSONResponse` or
:class:`EventStream`. Client: :func:`call` (JSON) and :func:`stream` (events).
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
        headers = [("content-type", "application/json"), ("content-length", str(len(body))), ("connection", "close")]
        await _send(stream, conn, h11.Response(status_code=answer.status, headers=headers))
        await _send(stream, conn, h11.Data(data=body))
        await _send(stream, conn, h11.EndOfMessage())
        return
    headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache"), ("connection", "close")]
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


async def _handle(stream: trio.SocketStream, handler: Handler) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
    try:
        try:
            request = await _read_request(stream, conn)
        except (h11.RemoteProtocolError, WireError, ValueError) as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _answer(stream, conn, JSONResponse(400, {"error": {"code": "bad_request", "message": str(exc)}}))
            return
        if request is None:
            return
        try:
            answer = await handler(request)
        except Exception as exc:  # a bug in a handler must not take the server (and its owner) down
            log.exception("request handler failed", extra={"target": request.target})
            answer = JSONResponse(500, {"error": {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}})
        await _answer(stream, conn, answer)
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
                    handlers.start_soon(_handle, stream, handler)
                    continue
                refusals.note(found, expected)
                if answered.take():
                    handlers.start_soon(_refuse, stream)
                else:
                    stream.socket.close()
                    await trio.sleep(_OVER_BUDGET_PAUSE_S)


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
    return trio.SocketStream(trio.socket.from_stdlib_socket(raw))


@asynccontextmanager
async def _exchange(
    path: Path | str, method: str, target: str, body: Any, accept: str, peer_pid: int | None
) -> AsyncIterator[tuple[h11.Response, h11.Connection, trio.SocketStream]]:
    try:
        stream = await connect_unix(str(path))
    except OSError as exc:
        raise WireError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    try:
        if peer_pid is not None and (served_by := _peer_pid(stream)) != peer_pid:
            raise NotThePeer(f"{path} is served by pid {served_by}, not by pid {peer_pid}")
        conn = h11.Connection(h11.CLIENT)
        payload = b"" if body is None else json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        headers = [
            ("host", "localhost"),
            ("accept", accept),
            ("connection", "close"),
            ("content-type", "application/json"),
            ("content-length", str(len(payload))),
        ]
        try:
            await _send(stream, conn, h11.Request(method=method, target=target, headers=headers))
            if payload:
                await _send(stream, conn, h11.Data(data=payload))
            await _send(stream, conn, h11.EndOfMessage())
            while True:
                event = await _next_event(stream, conn)
                if isinstance(event, h11.Response):
                    break
                if isinstance(event, h11.ConnectionClosed):
                    raise WireError(f"{path}: the peer closed the connection without answering")
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, OSError) as exc:
            raise WireError(f"{path}: connection lost: {exc}") from None
        yield event, conn, stream
    finally:
        await stream.aclose()


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
    path: Path | str, method: str, target: str, body: Any = None, *, peer_pid: int | None = None
) -> tuple[int, Any]:
    """One JSON request; returns (status, decoded JSON body). With ``peer_pid``, a socket served by any
    other process raises :class:`NotThePeer` before anything is sent."""
    async with _exchange(path, method, target, body, "application/json", peer_pid) as (response, conn, stream):
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
    path: Path | str, target: str, body: Any, *, peer_pid: int | None = None
) -> AsyncIterator[tuple[str, Any]]:
    """POST ``body`` asking for events; yields ``(event, data)``; ``peer_pid`` as for :func:`call`.

    A JSON (non-stream) answer is yielded once as ``("response", {"status", "document"})``. One
    event (or that answer) may be at most :data:`MAX_BODY_BYTES`.
    """
    async with _exchange(path, "POST", target, body, "text/event-stream", peer_pid) as (response, conn, sock):
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
