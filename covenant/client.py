"""A small blocking client for the control socket, used by the CLI.

HTTP/1.1 over a plain AF_UNIX socket; responses are read by
:class:`covenant.http_response.ResponseReader` (it replaced httptools, which imports
:mod:`typing`; issue 38). Not httpx (~180 ms to import), not ``http.client`` (~20–30 ms: it pulls in
``email.parser`` and ``ssl``) and not h11 (~20 ms with the ``dataclasses`` and
``inspect`` it needs): the ``covenant dispatch`` process has an end-to-end
budget of tens of milliseconds. No trio, pydantic, psutil or yaml may be
imported on this path either.

The request itself is a fixed shape (request line, four or five headers, a
JSON body) and is written out here; its target is checked to be plain
visible ASCII. Each request opens its own connection and says
``Connection: close``, so the server closes its side right after answering.

The socket comes from ``_socket``, the C module the ``socket`` module wraps: ``socket``
builds four ``IntEnum`` classes from the C constants when imported, about a tenth of the
``covenant dispatch`` process's instructions (docs/performance.md, issue 38), and this
client needs none of what its Python class adds (``makefile``, ``sendfile``, ``dup``).
"""

from __future__ import annotations

import _socket
from collections.abc import Iterator

from covenant.errors import CovenantError, ExitCode
from covenant.http_response import BadResponse, ResponseReader
from covenant.home_paths import home_command
from covenant.json_fast import dumps, loads

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = ["DaemonClient", "DaemonUnreachable", "RemoteError", "EXIT_BY_CODE"]

# Error codes the daemon answers with -> the CLI's exit code (DESIGN.md §7).
EXIT_BY_CODE: dict[str, int] = {
    "capability_denied": ExitCode.DENIED,
    "bad_signature": ExitCode.DENIED,
    "stale_intent": ExitCode.DENIED,
    "replayed_intent": ExitCode.DENIED,
    "budget_exhausted": ExitCode.DENIED,
    "workflow_denied": ExitCode.DENIED,
    "forbidden": ExitCode.DENIED,
    "no_agent": ExitCode.NO_AGENT,
    "ambiguous": ExitCode.NO_AGENT,
    "agent_stopped": ExitCode.NO_AGENT,
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


class _ConnectionLost(Exception):
    """The daemon closed the connection before the response was complete."""


class _Response:
    """One response over its own connection, parsed as it arrives.

    ``status``, ``read()`` as on an ``http.client`` response; ``chunks()`` streams the body.
    """

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._reader = ResponseReader()
        self.status = 0
        self.content_type = ""

    def _receive(self) -> None:
        data = self._sock.recv(_RECV_BYTES)
        if not data:
            raise _ConnectionLost("the daemon closed the connection before its answer was complete")
        self._reader.feed(data)

    def _start(self, head: bytes, payload: bytes | None) -> "_Response":
        """Send the request and read up to the end of the response's headers."""
        self._sock.sendall(head + payload if payload else head)
        while not self._reader.headers_done:
            self._receive()
        self.status = self._reader.status
        self.content_type = self._reader.headers.get("content-type", "")
        return self

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives (chunked encoding undone); ends at the end of the message."""
        while True:
            yield from self._reader.take_body()
            if self._reader.complete:
                return
            self._receive()

    def read(self) -> bytes:
        """The whole body."""
        return b"".join(self.chunks())


def _request_head(method: str, path: str, payload: bytes | None, accept: str | None = None) -> bytes:
    if not path.startswith("/") or not all("!" <= c <= "~" for c in path):
        raise ValueError(f"request target {path!r}: must start with / and be visible ASCII (quote it)")
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "Accept-Encoding: identity", "Connection: close"]
    if accept is not None:
        lines.append(f"Accept: {accept}")
    if payload is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    elif method in _BODY_METHODS:
        lines.append("Content-Length: 0")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


class DaemonClient:
    """Requests to the daemon at ``socket_path``; ``timeout`` (s) bounds each socket operation.

    ``home`` (its root) names the home the daemon serves in the hint given when none listens, so that
    the command the hint shows starts the right daemon when pasted.
    """

    def __init__(self, socket_path: str | Path, *, timeout: float | None = None, home: str | Path | None = None) -> None:
        self.socket_path = socket_path
        self._timeout = timeout
        self._home = home
        self._sock: _socket.socket | None = None

    def _command(self, command: str) -> str:
        """``covenant COMMAND`` for this client's home, as a hint prints it (:func:`covenant.home_paths.home_command`)."""
        return f"covenant {command}" if self._home is None else home_command(self._home, command)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "DaemonClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> _socket.socket:
        self.close()
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self._sock = sock
        if self._timeout is not None:
            sock.settimeout(self._timeout)
        sock.connect(str(self.socket_path))
        return sock

    def _send(self, method: str, path: str, body: Any = None, accept: str | None = None) -> _Response:
        payload = None if body is None else dumps(body, ensure_ascii=False).encode()
        head = _request_head(method, path, payload, accept)
        try:
            return _Response(self._connect())._start(head, payload)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self.close()
            raise DaemonUnreachable(
                f"the daemon is not running (no one listens on {self.socket_path}: {exc.strerror}); "
                f"start it with `{self._command('daemon')}` or `systemctl start covenant`"
            ) from None
        except PermissionError:
            self.close()
            raise DaemonUnreachable(
                f"permission denied on {self.socket_path}: join the socket's group or ask the operator"
            ) from None
        except (BadResponse, _ConnectionLost, OSError) as exc:
            self.close()
            raise DaemonUnreachable(
                f"lost the connection to the daemon at {self.socket_path}: {exc} "
                f"(it may be restarting or stopping; `{self._command('status')}` says whether it answers)"
            ) from None

    def _lost_while_reading(self, exc: Exception) -> DaemonUnreachable:
        self.close()
        return DaemonUnreachable(
            f"lost the connection to the daemon while reading its answer: {exc} "
            f"(it may have stopped; `{self._command('status')}` says whether it answers, `{self._command('history')}` "
            "what ran)"
        )

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request and return the decoded JSON; raise RemoteError for an error answer."""
        response = self._send(method, path, body)
        return self._document(response)

    def _document(self, response: _Response) -> Any:
        try:
            raw = response.read()
        except (BadResponse, _ConnectionLost, OSError) as exc:
            raise self._lost_while_reading(exc) from None
        finally:
            self.close()
        status = response.status
        try:
            document = loads(raw) if raw else None
        except ValueError:
            raise DaemonUnreachable(f"the daemon answered HTTP {status} with a body that is not JSON "
                                    f"(is something other than covenant listening on {self.socket_path}?)") from None
        if status != 200:
            error = (document or {}).get("error") if isinstance(document, dict) else None
            if not isinstance(error, dict):
                raise RemoteError("http_error", f"HTTP {status}", status, {})
            details = {k: v for k, v in error.items() if k not in ("code", "message")}
            raise RemoteError(str(error.get("code")), self._localized(str(error.get("message")), details), status, details)
        return document

    def _localized(self, message: str, details: dict[str, Any]) -> str:
        """``message`` with the command an error names (its ``command`` detail, e.g. ``start echo@local``) worded
        for this client's home: the daemon cannot know whether the user gave ``--home`` or ``COVENANT_HOME``."""
        command = details.get("command")
        if not isinstance(command, str) or self._home is None:
            return message
        return message.replace(f"`covenant {command}`", f"`{self._command(command)}`")

    def post_events(self, path: str, body: Any) -> Iterator[tuple[str, Any]]:
        """POST asking for ``text/event-stream``; yield ``(event, data)`` as they arrive.

        A server that answers with JSON instead (no stream for this request)
        yields it once as ``("response", document)``; an error answer raises RemoteError.
        """
        response = self._send("POST", path, body, accept="text/event-stream")
        if not response.content_type.startswith("text/event-stream"):
            yield "response", self._document(response)
            return
        try:
            pending = b""
            event = "message"
            try:
                for chunk in response.chunks():
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        if line.startswith(b"event: "):
                            event = line[7:].decode()
                        elif line.startswith(b"data: "):
                            yield event, loads(line[6:])
                            event = "message"
            except (BadResponse, _ConnectionLost, OSError) as exc:
                raise self._lost_while_reading(exc) from None
        finally:
            self.close()

    def events(self, path: str) -> Iterator[dict[str, Any]]:
        """Yield the JSON ``data:`` of a text/event-stream response until it ends."""
        response = self._send("GET", path)
        try:
            if response.status != 200:
                self._document(response)  # an error answer: raises RemoteError with the daemon's code and message
            pending = b""
            try:
                for chunk in response.chunks():
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        if line.startswith(b"data: "):
                            yield loads(line[6:])
            except (BadResponse, _ConnectionLost, OSError) as exc:
                raise self._lost_while_reading(exc) from None
            if pending.startswith(b"data: "):
                yield loads(pending[6:])
        finally:
            self.close()
