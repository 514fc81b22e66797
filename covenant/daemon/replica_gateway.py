"""The daemon's gateway for one replica: model and tool calls, on a socket only that replica reaches.

``<home>/state/replicas/<agent id>/gateway.sock``, one per replica, served by
the daemon. The calling agent is the one the socket belongs to — never a
field of the body — and only intents the daemon has in flight on that
replica are accepted (``unknown_intent`` otherwise). A peer other than the
replica's own process is refused too.

- ``POST /v1/model {"intent_id", "messages", "tools", "alias", "stream"}`` →
  the model gateway (the key, the token budget, fallback, ``model.call``
  audit): a ChatResult document, or with ``stream`` events ``token`` … then
  ``result`` (or ``error``). Errors ``{"error": {"code", "message"}}``.
- ``POST /v1/tool {"intent_id", "call_id", "name", "arguments"}`` → the tool
  host (grants, ``tool.call`` audit): ``{"ok", "content", "error_code",
  "error_message"}``; content is redacted per the agent's ``safety_policy``.
- ``POST /v1/session/append {"intent_id", "messages"}`` → ``{"ok": true}`` once
  the turn is durable in the session the daemon loaded for the intent before
  invoking it (:mod:`covenant.daemon.session_keeper`).
- ``POST /v1/attempt {"intent_id", "generated_code"}`` → one attempt of a
  ``loop: test-driven`` intent run as the agent and recorded
  (:mod:`covenant.daemon.test_attempts`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from covenant.daemon.intent_context import IntentContext
from covenant.errors import error_document
from covenant.rune import wire
from covenant.rune.gateway_client import (
    ATTEMPT_PATH,
    MODEL_PATH,
    SESSION_APPEND_PATH,
    TOOL_PATH,
)

if TYPE_CHECKING:
    from covenant.daemon.session_keeper import SessionKeeper

__all__ = ["GatewayCalls", "GatewayRefused", "ReplicaGateway"]

log = logging.getLogger("covenant.rune")


class GatewayCalls(Protocol):
    """The daemon's model and tool layers as one replica sees them."""

    async def model(
        self, intent: IntentContext, body: dict[str, Any], on_token: Callable[[str], Awaitable[None]] | None
    ) -> dict[str, Any]:
        """A ChatResult document; raise :class:`GatewayRefused` with the outcome code."""

    async def tool(self, intent: IntentContext, body: dict[str, Any]) -> dict[str, Any]:
        """``{"ok", "content", "error_code", "error_message"}``."""

    async def attempt(self, intent: IntentContext, body: dict[str, Any]) -> dict[str, Any]:
        """One attempt of a test-driven intent, run and recorded; raise :class:`GatewayRefused`."""


class GatewayRefused(Exception):
    def __init__(self, code: str, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class ReplicaGateway:
    """Request handling of one replica's gateway socket."""

    def __init__(self, agent_id: str, calls: GatewayCalls, intents: dict[str, IntentContext],
                 sessions: SessionKeeper) -> None:
        self.agent_id = agent_id
        self.calls = calls
        self.intents = intents
        self.sessions = sessions

    async def handle(self, request: wire.Request) -> wire.JSONResponse | wire.EventStream:
        if request.method != "POST" or request.target not in (MODEL_PATH, TOOL_PATH, SESSION_APPEND_PATH, ATTEMPT_PATH):
            return wire.JSONResponse(404, error_document("not_found", f"no such endpoint: {request.method} {request.target}"))
        body = request.body
        if not isinstance(body, dict) or not isinstance(body.get("intent_id"), str):
            return wire.JSONResponse(400, error_document("bad_request", "the body must be a JSON object with intent_id"))
        intent = self.intents.get(body["intent_id"])
        if intent is None:
            return wire.JSONResponse(
                403, error_document("unknown_intent", f"intent {body['intent_id']!r} is not in flight on {self.agent_id}")
            )
        if request.target == TOOL_PATH:
            return wire.JSONResponse(200, await self.calls.tool(intent, body))
        if request.target == SESSION_APPEND_PATH:
            return await self._append_session(intent, body)
        if request.target == ATTEMPT_PATH:
            try:
                return wire.JSONResponse(200, await self.calls.attempt(intent, body))
            except GatewayRefused as exc:
                return wire.JSONResponse(exc.status, error_document(exc.code, exc.message))
        if not body.get("stream"):
            try:
                return wire.JSONResponse(200, await self.calls.model(intent, body, None))
            except GatewayRefused as exc:
                return wire.JSONResponse(exc.status, error_document(exc.code, exc.message))

        async def produce(emit: wire.Emit) -> None:
            async def on_token(text: str) -> None:
                await emit("token", {"text": text})

            try:
                result = await self.calls.model(intent, body, on_token)
            except GatewayRefused as exc:
                await emit("error", error_document(exc.code, exc.message))
                return
            await emit("result", result)

        return wire.EventStream(produce)

    async def _append_session(self, intent: IntentContext, body: dict[str, Any]) -> wire.JSONResponse:
        """One turn appended, durably, to the session the daemon loaded for the intent."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return wire.JSONResponse(400, error_document("bad_request", "messages must be a list of objects"))
        try:
            await self.sessions.append(intent, messages)
        except LookupError as exc:
            return wire.JSONResponse(409, error_document("bad_request", str(exc)))
        except OSError as exc:  # disk full, a file that went away
            log.error("cannot append to a session", extra={"agent": self.agent_id, "session": intent.session_id,
                                                           "error": str(exc)})
            return wire.JSONResponse(500, error_document("crashed", f"session {intent.session_id} cannot be written: {exc}"))
        return wire.JSONResponse(200, {"ok": True})
