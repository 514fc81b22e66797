"""A small blocking client for the control socket, used by the CLI.

HTTP/1.1 over a plain AF_UNIX socket, framed and parsed by ``h11`` (the
server side's own HTTP library, hypercorn's dependency). Not httpx (~180 ms
to import) and not ``http.client`` (~20–30 ms: it pulls in ``email.parser``
and ``ssl``): the ``covenant dispatch`` process has an end-to-end budget of
tens of milliseconds. No trio, pydantic, psutil or yaml may be imported on
this path either.

Each request opens its own connection and says ``Connection: close``, so the
server closes its side right after answering.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11

from covenant.errors import CovenantError, ExitCode

__all__ = ["DaemonClient", "DaemonUnreachable", "RemoteError", "EXIT_BY_CODE"]

# Error codes the daemon answers with -> the CLI's exit code (DESIGN.md §7).
EXIT_BY_CODE: dict[str, int] = {
    "capability_denied": ExitCode.DENIED,
    "bad_signature": ExitCode.DENIED,
    "stale_intent": ExitCode.DENIED,
    "replayed_intent": ExitCode.DENIED,
    "budget_exhausted": ExitCode.DENIED,
    "forbidden": ExitCode.DENIED,
    "no_agent": ExitCode.NO_AGENT,
    "ambiguous": ExitCode.NO_AGENT,
    "overloaded": ExitCode.UNREACHABLE,
    "shutting_down": ExitCode.UNREACHABLE,
    "audit_unavailable": ExitCode.UNREACHABLE,
}

_RECV_BYTES = 65536
# Methods that carry a body: an empty one is announced as such (as http.client does).
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class DaemonUnreachable(CovenantError):
    code = "unreachable"
    exit_code = ExitCode.UNREACHABLE


class RemoteError(CovenantError):
    """The daemon answered with ``{"error": {...}}``."""

    def __init__(self, code: str, message: str, http_status: int, details: dict[str, Any]) -> None:
        super().__init__(message, **details)
        self.code = code
        self.http_status = http_status
        self.exit_code = EXIT_BY_CODE.get(code, ExitCode.USAGE)


class _Response:
    """One response over its own connection, read with h11 as it arrives.

    ``status``, ``read()`` as on an ``http.client`` response; ``chunks()`` streams the body.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._h11 = h11.Connection(h11.CLIENT)
        self.status = 0

    def _send(self, *events: h11.Event) -> None:
        self._sock.sendall(b"".join(self._h11.send(event) or b"" for event in events))

    def _next_event(self) -> object:
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._h11.receive_data(self._sock.recv(_RECV_BYTES))  # b"" at EOF: h11 decides if that is an error

    def _start(self, request: h11.Request, payload: bytes | None) -> "_Response":
        """Send the request and read up to the response's status line and headers."""
        if payload:
            self._send(request, h11.Data(data=payload), h11.EndOfMessage())
        else:
            self._send(request, h11.EndOfMessage())
        while True:
            event = self._next_event()
            if isinstance(event, h11.Response):
                self.status = event.status_code
                return self
            if not isinstance(event, h11.InformationalResponse):
                raise h11.RemoteProtocolError(f"expected a response, got {event!r}")

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives; ends at the end of the message."""
        while True:
            event = self._next_event()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            else:
                raise h11.RemoteProtocolError(f"unexpected {event!r} in a response body")

    def read(self) -> bytes:
        """The whole body."""
        return b"".join(self.chunks())


class DaemonClient:
    """Requests to the daemon at ``socket_path``; ``timeout`` (s) bounds each socket operation."""

    def __init__(self, socket_path: Path, *, timeout: float | None = None) -> None:
        self.socket_path = socket_path
        self._timeout = timeout
        self._sock: socket.socket | None = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "DaemonClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> socket.socket:
        self.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = sock
        if self._timeout is not None:
            sock.settimeout(self._timeout)
        sock.connect(str(self.socket_path))
        return sock

    def _send(self, method: str, path: str, body: Any = None) -> _Response:
        payload = None if body is None else json.dumps(body, ensure_ascii=False).encode()
        headers = [("host", "localhost"), ("accept-encoding", "identity"), ("connection", "close")]
        if payload is not None:
            headers += [("content-type", "application/json"), ("content-length", str(len(payload)))]
        elif method in _BODY_METHODS:
            headers.append(("content-length", "0"))
        try:
            return _Response(self._connect())._start(h11.Request(method=method, target=path, headers=headers), payload)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self.close()
            raise DaemonUnreachable(
                f"the daemon is not running (no one listens on {self.socket_path}: {exc.strerror}); "
                "start it with `covenant daemon` or `systemctl start covenant`"
            ) from None
        except PermissionError:
            self.close()
            raise DaemonUnreachable(
                f"permission denied on {self.socket_path}: join the socket's group or ask the operator"
            ) from None
        except (h11.ProtocolError, OSError) as exc:
            self.close()
            raise DaemonUnreachable(f"lost the connection to the daemon at {self.socket_path}: {exc}") from None

    def _lost_while_reading(self, exc: Exception) -> DaemonUnreachable:
        self.close()
        return DaemonUnreachable(f"lost the connection to the daemon while reading its answer: {exc}")

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request and return the decoded JSON; raise RemoteError for an error answer."""
        response = self._send(method, path, body)
        try:
            raw = response.read()
        except (h11.ProtocolError, OSError) as exc:
            raise self._lost_while_reading(exc) from None
        finally:
            self.close()
        status = response.status
        try:
            document = json.loads(raw) if raw else None
        except ValueError:
            raise DaemonUnreachable(f"the daemon answered HTTP {status} with a body that is not JSON") from None
        if status != 200:
            error = (document or {}).get("error") if isinstance(document, dict) else None
            if not isinstance(error, dict):
                raise RemoteError("http_error", f"HTTP {status}", status, {})
            details = {k: v for k, v in error.items() if k not in ("code", "message")}
            raise RemoteError(str(error.get("code")), str(error.get("message")), status, details)
        return document

    def events(self, path: str) -> Iterator[dict[str, Any]]:
        """Yield the JSON ``data:`` of a text/event-stream response until it ends."""
        response = self._send("GET", path)
        try:
            if response.status != 200:
                raise RemoteError("http_error", f"HTTP {response.status}", response.status, {})
            pending = b""
            try:
                for chunk in response.chunks():
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        if line.startswith(b"data: "):
                            yield json.loads(line[6:])
            except (h11.ProtocolError, OSError) as exc:
                raise self._lost_while_reading(exc) from None
            if pending.startswith(b"data: "):
                yield json.loads(pending[6:])
        finally:
            self.close()
