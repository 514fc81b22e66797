"""A small blocking client for the control socket, used by the CLI.

Built on the standard library's ``http.client`` rather than httpx: the
``covenant dispatch`` process has an end-to-end budget of tens of
milliseconds, and importing httpx alone costs ~180 ms here (http.client
~30 ms). No trio, pydantic, psutil or yaml may be imported on this path.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            sock.settimeout(self.timeout)
        sock.connect(str(self._path))
        self.sock = sock


class DaemonClient:
    """One connection to the daemon at ``socket_path``."""

    def __init__(self, socket_path: Path, *, timeout: float | None = None) -> None:
        self.socket_path = socket_path
        self._connection = _UnixConnection(socket_path, timeout)

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> "DaemonClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, body: Any = None) -> http.client.HTTPResponse:
        payload = None if body is None else json.dumps(body, ensure_ascii=False).encode()
        # One request per connection: say so, so the server closes its side right after answering.
        headers = {"connection": "close"}
        if payload is not None:
            headers["content-type"] = "application/json"
        try:
            self._connection.request(method, path, body=payload, headers=headers)
            return self._connection.getresponse()
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonUnreachable(
                f"the daemon is not running (no one listens on {self.socket_path}: {exc.strerror}); "
                "start it with `covenant daemon` or `systemctl start covenant`"
            ) from None
        except PermissionError:
            raise DaemonUnreachable(
                f"permission denied on {self.socket_path}: join the socket's group or ask the operator"
            ) from None
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise DaemonUnreachable(f"lost the connection to the daemon at {self.socket_path}: {exc}") from None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request and return the decoded JSON; raise RemoteError for an error answer."""
        response = self._send(method, path, body)
        try:
            raw = response.read()
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise DaemonUnreachable(f"lost the connection to the daemon while reading its answer: {exc}") from None
        try:
            document = json.loads(raw) if raw else None
        except ValueError:
            raise DaemonUnreachable(f"the daemon answered HTTP {response.status} with a body that is not JSON") from None
        if response.status != 200:
            error = (document or {}).get("error") if isinstance(document, dict) else None
            if not isinstance(error, dict):
                raise RemoteError("http_error", f"HTTP {response.status}", response.status, {})
            details = {k: v for k, v in error.items() if k not in ("code", "message")}
            raise RemoteError(str(error.get("code")), str(error.get("message")), response.status, details)
        return document

    def events(self, path: str) -> Iterator[dict[str, Any]]:
        """Yield the JSON ``data:`` of a text/event-stream response until it ends."""
        response = self._send("GET", path)
        if response.status != 200:
            raise RemoteError("http_error", f"HTTP {response.status}", response.status, {})
        while True:
            line = response.readline()
            if not line:
                return
            if line.startswith(b"data: "):
                yield json.loads(line[6:])
