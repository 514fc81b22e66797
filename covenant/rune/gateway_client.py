"""The replica's side of the daemon's per-replica gateway: a loop :class:`~covenant.rune.loop.Backend`.

The replica holds no provider key and reaches no provider: each model turn
is ``POST /v1/model`` and each tool call ``POST /v1/tool`` on the gateway
socket the daemon listens on for this replica only. The daemon knows the
agent from the socket and accepts only the intents it has in flight there.
It is also the intent's :class:`~covenant.rune.conversation.SessionStore`:
the session's turns came with the invoke, an ``each_step`` checkpoint is
``POST /v1/session/append``, an ``on_finish`` one goes back with the answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from covenant.rune import wire
from covenant.rune.loop import LoopFailed

__all__ = ["GatewayBackend", "MODEL_PATH", "TOOL_PATH", "SESSION_APPEND_PATH", "ATTEMPT_PATH"]

MODEL_PATH = "/v1/model"
TOOL_PATH = "/v1/tool"
SESSION_APPEND_PATH = "/v1/session/append"
ATTEMPT_PATH = "/v1/attempt"


def _failure(document: Any, status: int) -> LoopFailed:
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict):
        return LoopFailed("provider_error", f"the model gateway answered HTTP {status} without an error document")
    return LoopFailed(str(error.get("code") or "provider_error"), str(error.get("message") or ""))


class GatewayBackend:
    """Model and tool calls of one intent, through ``gateway`` (a unix socket path) served by ``gateway_pid``.

    A process of the agent's uid (a tool's leftover) could replace the socket with a server of its own and
    answer for the model; a socket served by any process but the daemon's is refused, and ``taken_over``
    is called with why. With ``pool`` (the replica's, shared by its intents), the calls go on kept-alive
    connections to the gateway (:class:`~covenant.rune.wire.ConnectionPool`, made for ``gateway`` and
    ``gateway_pid``).
    """

    def __init__(self, gateway: Path, intent_id: str, gateway_pid: int, taken_over: Callable[[str], None],
                 session: Any = None, pool: wire.ConnectionPool | None = None) -> None:
        self.gateway = gateway
        self.pool = pool
        self.intent_id = intent_id
        self.gateway_pid = gateway_pid
        self.taken_over = taken_over
        self.session = session
        """The intent's session as the daemon sent it with the invoke (``{"records", "torn_bytes"}``)."""
        self.checkpoint: list[dict[str, Any]] | None = None
        """The ``on_finish`` turn: it goes back with the answer, and the daemon appends it before answering."""

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_token: Callable[[str], Awaitable[None]] | None,
        *,
        adapter: str | None = None,
    ) -> dict[str, Any]:
        body = {"intent_id": self.intent_id, "messages": messages, "tools": tools, "alias": None,
                "stream": on_token is not None}
        if adapter is not None:
            body["adapter"] = adapter
        try:
            if on_token is None:
                status, document = await wire.call(self.gateway, "POST", MODEL_PATH, body, peer_pid=self.gateway_pid,
                                                     pool=self.pool)
                if status != 200:
                    raise _failure(document, status)
                return document
            events = wire.stream(self.gateway, MODEL_PATH, body, peer_pid=self.gateway_pid, pool=self.pool)
            try:
                async for event, data in events:
                    if event == "token":
                        await on_token(str(data.get("text") or ""))
                    elif event == "result":
                        return data
                    elif event == "error":
                        raise _failure(data, 502)
                    elif event == "response":
                        if data["status"] != 200:
                            raise _failure(data["document"], data["status"])
                        return data["document"]
            finally:
                await events.aclose()
        except wire.NotThePeer as exc:
            self.taken_over(str(exc))
            raise LoopFailed("provider_unavailable", f"the model gateway is not the daemon's: {exc}") from None
        except wire.WireError as exc:
            raise LoopFailed("provider_unavailable", f"the daemon's model gateway cannot be reached: {exc}") from None
        raise LoopFailed("provider_error", "the model gateway's stream ended without a result")

    async def tool(self, call_id: str, name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
        body = {"intent_id": self.intent_id, "call_id": call_id, "name": name, "arguments": arguments}
        try:
            status, document = await wire.call(self.gateway, "POST", TOOL_PATH, body, peer_pid=self.gateway_pid,
                                                 pool=self.pool)
        except wire.NotThePeer as exc:
            self.taken_over(str(exc))
            return {"ok": False, "error_code": "tool_unavailable", "error_message": f"the tool gateway is not the daemon's: {exc}"}
        except wire.WireError as exc:
            return {"ok": False, "error_code": "tool_unavailable", "error_message": f"the daemon's tool gateway cannot be reached: {exc}"}
        if status == 200 and isinstance(document, dict) and document.get("ok") is True:
            return document
        error = document.get("error") if isinstance(document, dict) else None
        error = error if isinstance(error, dict) else {}
        return {"ok": False, "error_code": str(error.get("code") or "tool_failed"),
                "error_message": str(error.get("message") or f"HTTP {status}")}

    async def _post(self, gateway: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` to the daemon's ``path``; its answer, or LoopFailed (``crashed`` when the gateway is gone or
        not the daemon's, else the failure the daemon answered)."""
        try:
            status, document = await wire.call(self.gateway, "POST", path, body, peer_pid=self.gateway_pid, pool=self.pool)
        except wire.NotThePeer as exc:
            self.taken_over(str(exc))
            raise LoopFailed("crashed", f"the {gateway} gateway is not the daemon's: {exc}") from None
        except wire.WireError as exc:
            raise LoopFailed("crashed", f"the daemon's {gateway} gateway cannot be reached: {exc}") from None
        if status != 200 or not isinstance(document, dict):
            raise _failure(document, status)
        return document

    async def attempt(self, generated_code: str) -> dict[str, Any]:
        """One attempt of the test-driven loop: the daemon runs the code with the intent's test suite as the agent
        and records it; raise LoopFailed (``tests_exhausted`` once the attempts are spent)."""
        return await self._post("attempt", ATTEMPT_PATH, {"intent_id": self.intent_id, "generated_code": generated_code})

    async def load_session(self) -> tuple[list[dict[str, Any]], int]:
        """The intent's session as the daemon loaded it for the invoke: (turn records, torn bytes cut)."""
        session = self.session if isinstance(self.session, dict) else {}
        records, torn = session.get("records"), session.get("torn_bytes")
        if not isinstance(records, list) or not isinstance(torn, int):
            raise LoopFailed("session_corrupt", "the daemon sent no session with this intent")
        return [r for r in records if isinstance(r, dict)], torn

    async def finish_session(self, messages: list[dict[str, Any]]) -> None:
        self.checkpoint = messages

    async def append_session(self, messages: list[dict[str, Any]]) -> None:
        """One turn of the intent's session, made durable by the daemon; raise LoopFailed."""
        await self._post("session", SESSION_APPEND_PATH, {"intent_id": self.intent_id, "messages": messages})
