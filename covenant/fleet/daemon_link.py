"""The fleet process's client of its daemon's control socket (asyncio).

The blocking :class:`covenant.client.DaemonClient` would need a thread per
running dispatch; this one is the same fixed-shape HTTP/1.1 request over a unix
socket, one connection per request (``Connection: close``), its answer parsed by
``httptools`` as it arrives. A dispatch body is sent byte for byte
as it came out of NATS: the signed intent unchanged.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httptools

from covenant.client import DaemonUnreachable
from covenant.errors import error_document

__all__ = ["DaemonLink", "Answer"]

_MAX_ANSWER_BYTES = 64 * 1024 * 1024


class Answer:
    """One HTTP answer of the daemon: ``status`` and its JSON ``document``."""

    __slots__ = ("status", "document")

    def __init__(self, status: int, document: Any) -> None:
        self.status = status
        self.document = document

    @property
    def error_code(self) -> str | None:
        error = self.document.get("error") if isinstance(self.document, dict) else None
        return str(error.get("code")) if isinstance(error, dict) else None


class _Parsed:
    """httptools' callbacks: the status and the body."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class DaemonLink:
    """Requests to the daemon listening on ``socket_path``."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path

    async def request(self, method: str, path: str, payload: bytes | None = None) -> Answer:
        """One request; DaemonUnreachable when no daemon answers, or it hung up before answering."""
        # Covenant-Client lets the daemon's status say when this process last asked (docs/fleet.md).
        head = [f"{method} {path} HTTP/1.1", "Host: localhost", "Connection: close", "Covenant-Client: fleet"]
        if payload is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        elif method == "POST":
            head.append("Content-Length: 0")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + (payload or b"")
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=1 << 20)
        except OSError as exc:
            raise DaemonUnreachable(f"the daemon does not answer on {self.socket_path}: {exc.strerror or exc}") from None
        parsed = _Parsed()
        try:
            writer.write(request)
            await writer.drain()
            size = 0
            # Done at the end of the message, not at EOF: the daemon may close its side a little later.
            while not parsed.complete:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    raise DaemonUnreachable(f"the daemon at {self.socket_path} hung up before its answer to "
                                            f"{method} {path} was complete (it may have stopped)")
                size += len(chunk)
                if size > _MAX_ANSWER_BYTES:
                    raise DaemonUnreachable(f"the daemon's answer to {method} {path} is over {_MAX_ANSWER_BYTES} bytes")
                parsed.parser.feed_data(chunk)
        except httptools.HttpParserError as exc:
            raise DaemonUnreachable(f"the daemon's answer to {method} {path} is not HTTP: {exc}") from None
        except OSError as exc:
            raise DaemonUnreachable(f"lost the connection to the daemon at {self.socket_path}: {exc}") from None
        finally:
            writer.close()
        status = parsed.parser.get_status_code()
        body = b"".join(parsed.body)
        try:
            document = json.loads(body) if body else None
        except ValueError:
            document = error_document("bad_answer", f"HTTP {status} with a body that is not JSON")
        return Answer(status, document)

    async def get(self, path: str) -> Any:
        """GET a document that must be there (status, agents); DaemonUnreachable otherwise."""
        answer = await self.request("GET", path)
        if answer.status != 200:
            raise DaemonUnreachable(f"the daemon answered GET {path} with HTTP {answer.status}: {answer.error_code}")
        return answer.document

    async def dispatch(self, body: bytes) -> Answer:
        """``POST /v1/dispatch`` with ``body`` exactly as given."""
        return await self.request("POST", "/v1/dispatch", body)

    async def record(self, intent_id: str) -> dict[str, Any] | None:
        """The dispatch record of ``intent_id`` on this host, or None."""
        from urllib.parse import quote

        answer = await self.request("GET", f"/v1/dispatches/{quote(intent_id, safe='')}")
        if answer.status == 404:
            return None
        if answer.status != 200 or not isinstance(answer.document, dict):
            raise DaemonUnreachable(f"the daemon answered the record of {intent_id} with HTTP {answer.status}")
        return answer.document

    async def audit_event(self, type_: str, data: dict[str, Any]) -> None:
        """Have the daemon record a ``fleet.*`` event (``POST /v1/fleet/events``; root or the daemon's uid)."""
        payload = json.dumps({"type": type_, "data": data}, separators=(",", ":")).encode()
        answer = await self.request("POST", "/v1/fleet/events", payload)
        if answer.status != 200:
            error = answer.document.get("error") if isinstance(answer.document, dict) else None
            message = error.get("message") if isinstance(error, dict) else f"HTTP {answer.status}"
            raise DaemonUnreachable(f"the daemon did not record {type_}: {message}")
