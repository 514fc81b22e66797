"""Serve HTTP/1.1 parsed by h11, one trio task per connection: the control API on unix sockets, and
(behind the connection caps of :mod:`covenant.daemon.network_server`) the webhook and A2A listeners.

The control socket carries one short request per connection (``covenant
dispatch``) far more often than anything else, so the server does as little
as it can around h11: no task per request, no timers besides one deadline
per read, the response head and body in one write. It also knows each
peer's credentials (SO_PEERCRED), which the app reads from
``scope["extensions"]["covenant.peer"]``: administrative calls are decided on
them. (hypercorn, which served this socket and the network listeners before,
spent about 0.8 ms per request in its own bookkeeping, and left a connection
open after an answer given before the request's body was read.)

What an app sees is plain ASGI 3 ``http``: ``receive()`` yields the body in
chunks, then blocks until the client hangs up (``http.disconnect``);
``send()`` raises :class:`ClientGone` once the client is gone, as the ASGI
spec asks. A response with ``content-length`` goes out in one write with its
body; one without is sent chunked. Requests on one connection are served one
after the other (keep-alive, pipelining).

A client has :class:`ReadTimeouts` to send each request: its head within
``head_s`` of the server starting to wait for it (the connection's opening,
or the end of the previous answer), its body within ``body_s`` of the head.
Past either, the connection is closed unanswered and the app, if it was
reading the body, gets ``http.disconnect``. An answer begun before the
request's body was read (a refusal: 401, 404, 413, ...) refuses that body:
it carries ``Connection: close``, the body is never handed to the app, and
the connection is closed after the answer (lingering briefly, so that a
client still writing its body reads the answer rather than a reset).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import h11
import trio

from covenant.errors import ConfigError, error_document

__all__ = ["Peer", "ClientGone", "ReadTimeouts", "ClosedHook", "bind_unix_socket", "serve", "serve_connection",
           "peer_of"]

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

ClosedHook = Callable[[str], None]
"""Told why the server closed a connection on its own: ``header_timeout`` (a request head not whole in time;
an idle kept-alive connection is not counted) or ``body_timeout``."""
_READ_SIZE = 65536
_LINGER_S = 1.0
_LINGER_BYTES = 1 << 20
"""After refusing a request or answering one without reading its body, what is read and dropped
before closing, so the client gets the answer rather than a reset for the bytes it was still sending.
Also the most a client may send past its request while the answer streams (a pipelined next request)."""

_UCRED = struct.Struct("3i")

log = logging.getLogger("covenant.daemon")


@dataclass(frozen=True)
class ReadTimeouts:
    """How long a client may take to send a request's head, then its body (seconds, each a whole deadline:
    a client trickling one byte at a time gets no more)."""

    head_s: float = 10.0
    body_s: float = 30.0


@dataclass(frozen=True)
class Peer:
    """Credentials of the process on the other end of a unix socket."""

    pid: int
    uid: int
    gid: int


class ClientGone(OSError):
    """The client hung up: nothing more can be sent on this connection."""


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


class _Connection:
    """One client connection: h11's state machine over a trio stream."""

    def __init__(self, stream: trio.SocketStream, app: ASGIApp, peer: Peer | None, *, timeouts: ReadTimeouts,
                 on_closed: ClosedHook | None = None, client: tuple[str, int] | None = None) -> None:
        self.stream = stream
        self.app = app
        self.peer = peer
        self.timeouts = timeouts
        self.on_closed = on_closed
        self.client = client
        self.h11 = h11.Connection(h11.SERVER)
        self.gone = False
        """The client hung up (or its socket broke, or it was too slow): stop reading and writing."""
        self.linger = False
        """A request was refused, or answered with its body unread: linger before closing."""
        self.body_refused = False
        """The answer began before the body was read: the body is never handed to the app."""
        self.body_deadline = 0.0
        self.served = 0

    async def serve(self) -> None:
        try:
            while not self.gone:
                request = await self._next_request()
                if request is None:
                    break
                self.body_deadline = trio.current_time() + self.timeouts.body_s
                self.body_refused = False
                await self._respond(request)
                self.served += 1
                if self.h11.their_state is h11.SEND_BODY:
                    self.linger = True  # the app answered without reading the body: close without a reset
                if self.gone or self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
                    break  # a close was asked for, the body was left unread, or the app did not finish
                self.h11.start_next_cycle()
        finally:
            with trio.CancelScope(shield=True):
                if self.linger and not self.gone:
                    await self._linger()
                await self.stream.aclose()

    async def _linger(self) -> None:
        """Stop sending, then drop what the client still sends for a moment (bounded)."""
        dropped = 0
        with trio.move_on_after(_LINGER_S):
            try:
                await self.stream.send_eof()
                while dropped < _LINGER_BYTES and (data := await self.stream.receive_some(_READ_SIZE)):
                    dropped += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    def _body_is_read(self) -> bool:
        """Is the request's body read (or empty and already here, e.g. a GET's), without waiting for the socket?"""
        try:
            while self.h11.their_state is h11.SEND_BODY:
                event = self.h11.next_event()
                if event is h11.NEED_DATA or not isinstance(event, (h11.Data, h11.EndOfMessage)) or (
                        isinstance(event, h11.Data) and event.data):
                    return False  # a body the app has not read: refused, the connection closes after the answer
        except h11.RemoteProtocolError:
            return False
        return True

    async def _next_event(self, deadline: float, late: str) -> Any:
        """The next h11 event, reading from the socket as needed until ``deadline`` (trio time);
        ConnectionClosed when the client left or was too slow (``late`` says for what)."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            with trio.move_on_at(deadline) as waited:
                data = await self._receive()
            if waited.cancelled_caught:
                self._too_slow(late)
                return h11.ConnectionClosed()
            self.h11.receive_data(data)

    def _too_slow(self, late: str) -> None:
        self.gone = True
        idle = late == "header_timeout" and self.served and not self.h11.trailing_data[0]
        if self.on_closed is not None and not idle:  # a kept-alive connection that sends nothing more is no offence
            self.on_closed(late)

    async def _receive(self) -> bytes:
        try:
            data = await self.stream.receive_some(_READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.gone = True
        return data

    async def _next_request(self) -> h11.Request | None:
        try:
            event = await self._next_event(trio.current_time() + self.timeouts.head_s, "header_timeout")
            if isinstance(event, h11.Request):
                return event
        except h11.RemoteProtocolError as exc:
            await self._refuse(exc.error_status_hint, "bad_request", f"malformed HTTP request: {exc}")
        return None

    async def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer with the API's error document and close, if a response can still be sent."""
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE) or self.gone:
            return
        self.linger = True
        body = json.dumps(error_document(code, message)).encode() + b"\n"
        headers = [("content-type", "application/json"), ("content-length", str(len(body))), ("connection", "close")]
        try:
            await self._write(self.h11.send(h11.Response(status_code=status, headers=headers))
                              + self.h11.send(h11.Data(data=body)) + self.h11.send(h11.EndOfMessage()))
        except (h11.LocalProtocolError, ClientGone):
            pass

    async def _write(self, data: bytes) -> None:
        if self.gone:
            raise ClientGone("the client hung up")
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.gone = True
            raise ClientGone("the client hung up") from exc

    async def _respond(self, request: h11.Request) -> None:
        target = bytes(request.target)
        raw_path, _, query = target.partition(b"?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": request.http_version.decode(),
            "method": request.method.decode("ascii"),
            "scheme": "http",
            "path": unquote_to_bytes(raw_path).decode("utf-8", "replace"),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": [(name, value) for name, value in request.headers],
            "client": self.client,
            "server": None,
            "extensions": {"covenant.peer": self.peer},
        }
        response = _Response(self, head_only=request.method == b"HEAD")
        try:
            await self.app(scope, self._receive_body, response.send)
        except ClientGone:
            return
        except Exception:
            log.exception("HTTP request failed", extra={"path": scope["path"]})
            if not response.started:
                await self._refuse(500, "internal_error", "internal error; see the daemon log")
            self.gone = True  # the response is cut short: the client must not take it for whole
            return
        if not response.finished:
            self.gone = True

    async def _receive_body(self) -> dict:
        """ASGI ``receive``: the request body in chunks, then ``http.disconnect`` once the client leaves."""
        if self.body_refused:
            return {"type": "http.disconnect"}
        if self.h11.their_state is h11.SEND_BODY and not self.gone:
            if self.h11.they_are_waiting_for_100_continue:
                await self._write(self.h11.send(h11.InformationalResponse(status_code=100, headers=[])))
            try:
                event = await self._next_event(self.body_deadline, "body_timeout")
            except h11.RemoteProtocolError:
                self.gone = True
                return {"type": "http.disconnect"}
            if isinstance(event, h11.Data):
                return {"type": "http.request", "body": bytes(event.data), "more_body": True}
            if isinstance(event, h11.EndOfMessage):
                return {"type": "http.request", "body": b"", "more_body": False}
            return {"type": "http.disconnect"}
        pipelined = 0
        while not self.gone:  # the body is read: wait for the client to hang up
            data = await self._receive()
            pipelined += len(data)
            if pipelined > _LINGER_BYTES:
                self.gone = True  # more than a next request: stop buffering it
            elif data:
                self.h11.receive_data(data)  # a pipelined next request: h11 keeps it for later
        return {"type": "http.disconnect"}


class _Response:
    """ASGI ``send`` for one response.

    A head that announces its length is held back and written together with
    the body (one write); the head of a streamed response goes out at once.
    """

    def __init__(self, connection: _Connection, head_only: bool) -> None:
        self.connection = connection
        self.head_only = head_only
        self.started = False
        self.finished = False
        self._head: tuple[int, list[tuple[bytes, bytes]]] | None = None

    async def send(self, message: dict) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self._head = (int(message["status"]), list(message.get("headers") or []))
            connection = self.connection
            if not connection.body_refused and not connection._body_is_read():
                connection.body_refused = True  # answered before the body: it is not read, the connection closes
                self._head[1].append((b"connection", b"close"))
            if any(name.lower() == b"content-length" for name, _ in self._head[1]):
                return  # written with the body
            await self.connection._write(self._head_bytes())
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if not self.started or self.finished:
            raise RuntimeError("http.response.body outside a response")
        conn = self.connection.h11
        body = bytes(message.get("body") or b"")
        more = bool(message.get("more_body"))
        out = self._head_bytes() if self._head is not None else b""
        if body and not self.head_only:
            out += conn.send(h11.Data(data=body))
        if not more:
            out += conn.send(h11.EndOfMessage())
            self.finished = True
        if out:
            await self.connection._write(out)

    def _head_bytes(self) -> bytes:
        assert self._head is not None
        status, headers = self._head
        self._head = None
        return self.connection.h11.send(h11.Response(status_code=status, headers=headers))


async def serve_connection(
    stream: trio.SocketStream,
    app: ASGIApp,
    *,
    timeouts: ReadTimeouts,
    on_closed: ClosedHook | None = None,
    client: tuple[str, int] | None = None,
) -> None:
    """Serve the requests of one accepted connection until it closes (``client``: the TCP peer's address)."""
    await _Connection(stream, app, peer_of(stream.socket), timeouts=timeouts, on_closed=on_closed,  # type: ignore[arg-type]
                      client=client).serve()


async def serve(
    app: ASGIApp,
    sockets: list[socket.socket],
    *,
    timeouts: ReadTimeouts = ReadTimeouts(),
    on_closed: ClosedHook | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections on ``sockets`` (the control socket) forever; cancel the caller's scope to stop."""
    listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(s)) for s in sockets]

    async def handle(stream: trio.SocketStream) -> None:
        await serve_connection(stream, app, timeouts=timeouts, on_closed=on_closed)

    await trio.serve_listeners(handle, listeners, task_status=task_status)
