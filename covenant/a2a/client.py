"""Calling remote A2A agents: read the card, send one message, wait for the task to end.

The daemon makes these calls, never a replica, and only to URLs the caller
already checked against ``[a2a] remotes`` (:mod:`covenant.a2a.remotes`); the
endpoint a card names is checked again here, so a card cannot point covenant
anywhere else. Redirects are not followed. A2A 1.0 is spoken when the card
offers it; 0.3 when the card is a 0.3 card or when there is no card at all
(raftio's layout: JSON-RPC posted to the agent's URL).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from covenant import outside_json
from covenant.a2a import wire
from covenant.a2a.config import A2AConfig
from covenant.a2a.remotes import allowed, token_for
from covenant.errors import CovenantError, ExitCode

__all__ = ["RemoteAgents", "RemoteAnswer", "RemoteFailed", "Endpoint"]

_CARD_PATH = "/.well-known/agent-card.json"
_CARD_TTL_S = 300.0
_CARDS_MAX = 256
"""Cards remembered; the cache is cleared when it is full (URLs are bounded by remotes, not by number)."""
_STILL_RUNNING = frozenset({"SUBMITTED", "WORKING"})
"""Remote task states worth polling; any other (INPUT_REQUIRED, AUTH_REQUIRED, a terminal one) ends the call."""
_POLL_S = 0.5


class RemoteFailed(CovenantError):
    """A remote call that did not give an answer; ``code`` says why (docs/a2a.md)."""

    code = "remote_error"
    exit_code = ExitCode.AGENT_FAILED
    http_status = 502

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Endpoint:
    url: str
    binding: str  # "jsonrpc" or "http+json"
    version: wire.Version


@dataclass(frozen=True)
class RemoteAnswer:
    text: str
    task_id: str | None
    state: str
    context_id: str | None
    endpoint: Endpoint


class RemoteAgents:
    """The daemon's A2A client: cached cards, one shared HTTP connection pool."""

    def __init__(self, config: A2AConfig, environ: Mapping[str, str]) -> None:
        self.config = config
        self.environ = environ
        self.max_answer = config.max_answer_kb * 1024
        self._cards: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._http: Any = None

    def set_config(self, config: A2AConfig) -> None:
        """Take a reloaded ``[a2a]``: every request from now on is checked against its ``remotes`` and sent with
        its ``remote_tokens`` and limits (a call still polling a remote that was removed is refused at its
        next request)."""
        self.config = config
        self.max_answer = config.max_answer_kb * 1024

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    # -- public ----------------------------------------------------------------------------

    async def card(self, url: str) -> dict[str, Any] | None:
        """The agent card at ``<url>/.well-known/agent-card.json`` (cached), or None when it has none."""
        url = url.rstrip("/")
        cached = self._cards.get(url)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        status, body = await self._request("GET", url + _CARD_PATH, None, url)
        if status in (404, 405, 410):
            card = None
        elif status != 200:
            raise RemoteFailed("remote_error", f"{url}: the agent card answered HTTP {status}")
        else:
            card = _json_object(body, f"{url}{_CARD_PATH}")
        if len(self._cards) >= _CARDS_MAX:
            self._cards.clear()
        self._cards[url] = (time.monotonic() + _CARD_TTL_S, card)
        return card

    async def send(self, url: str, text: str, *, context_id: str | None) -> RemoteAnswer:
        """One message to the agent at ``url``; its answer once the remote task has ended."""
        endpoint = self.endpoint(url, await self.card(url))
        message_id = uuid.uuid4().hex
        if endpoint.version == wire.V1:
            message: dict[str, Any] = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
        else:
            message = {"kind": "message", "messageId": message_id, "role": "user",
                       "parts": [{"kind": "text", "text": text}]}
        if context_id:
            message["contextId"] = context_id
        result = await self._call(endpoint, "send", {"message": message}, url)
        answer = _read_answer(result, endpoint)
        while answer.state in _STILL_RUNNING and answer.task_id:
            await trio.sleep(_POLL_S)  # the caller's deadline (a cancel scope around us) ends this loop
            answer = _read_answer(await self._call(endpoint, "get", {"id": answer.task_id}, url), endpoint)
        return answer

    def endpoint(self, url: str, card: dict[str, Any] | None) -> Endpoint:
        """Where and how to send: the card's 1.0 JSON-RPC interface first, then HTTP+JSON, then 0.3."""
        url = url.rstrip("/")
        if card is None:
            return Endpoint(url, "jsonrpc", wire.V03)
        interfaces = [i for i in card.get("supportedInterfaces") or [] if isinstance(i, dict)]
        found = None
        for binding in ("JSONRPC", "HTTP+JSON"):
            for interface in interfaces:
                if interface.get("protocolBinding") == binding and str(interface.get("protocolVersion", "")).startswith("1."):
                    found = found or Endpoint(str(interface.get("url", "")), binding.lower(), wire.V1)
        if found is None and isinstance(card.get("url"), str):
            found = Endpoint(card["url"], "jsonrpc", wire.V03)
        if found is None:
            raise RemoteFailed("remote_error", f"{url}: the agent card offers no JSON-RPC or HTTP+JSON interface")
        if not allowed(found.url, self.config.remotes):
            raise RemoteFailed("remote", f"{url}: its card names {found.url!r}, which is not under [a2a] remotes")
        return found

    # -- wire ------------------------------------------------------------------------------

    async def _call(self, endpoint: Endpoint, action: str, params: dict[str, Any], base: str) -> Any:
        if endpoint.binding == "http+json":
            if action == "send":
                status, body = await self._request("POST", endpoint.url + "/message:send", params, base)
            else:
                status, body = await self._request("GET", f"{endpoint.url}/tasks/{params['id']}", None, base)
            if status != 200:
                raise RemoteFailed("remote_error", f"{endpoint.url}: HTTP {status}: {body[:200].decode(errors='replace')}")
            return _json_object(body, endpoint.url)
        methods = {wire.V1: {"send": "SendMessage", "get": "GetTask"}, wire.V03: {"send": "message/send", "get": "tasks/get"}}
        request = {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": methods[endpoint.version][action], "params": params}
        status, body = await self._request("POST", endpoint.url, request, base, version=endpoint.version)
        if status != 200:
            raise RemoteFailed("remote_error", f"{endpoint.url}: HTTP {status}")
        document = _json_object(body, endpoint.url)
        if isinstance(document.get("error"), dict):
            error = document["error"]
            raise RemoteFailed("remote_error", f"{endpoint.url}: JSON-RPC error {error.get('code')}: "
                                               f"{str(error.get('message'))[:200]}")
        if "result" not in document:
            raise RemoteFailed("remote_error", f"{endpoint.url}: a JSON-RPC answer with neither result nor error")
        return document["result"]

    async def _request(self, method: str, url: str, body: Any, base: str, *,
                       version: wire.Version = wire.V1) -> tuple[int, bytes]:
        if not allowed(url, self.config.remotes):
            raise RemoteFailed("remote", f"{url} is not under [a2a] remotes")
        import httpx  # only daemons that call remote agents pay for it

        if self._http is None:
            self._http = httpx.AsyncClient(trust_env=False, follow_redirects=False,
                                           timeout=httpx.Timeout(self.config.call_timeout_ms / 1000))
        headers = {"Accept": "application/json", "A2A-Version": version}
        token = token_for(base, self.config.remote_tokens, self.environ)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        content = json.dumps(body).encode() if body is not None else None
        if content is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with self._http.stream(method, url, content=content, headers=headers) as response:
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > self.max_answer:
                        raise RemoteFailed("remote_too_large", f"{url}: the answer is over [a2a] max_answer_kb = "
                                                               f"{self.config.max_answer_kb}")
                    chunks.append(chunk)
                return response.status_code, b"".join(chunks)
        except httpx.TimeoutException:
            raise RemoteFailed("timeout", f"{url}: no answer within [a2a] call_timeout_ms") from None
        except httpx.HTTPError as exc:
            raise RemoteFailed("remote_unreachable", f"{url}: {type(exc).__name__}: {exc}") from None


def _json_object(body: bytes, where: str) -> dict[str, Any]:
    try:
        document = outside_json.loads(body)
    except ValueError:
        raise RemoteFailed("remote_error", f"{where}: the answer is not JSON") from None
    if not isinstance(document, dict):
        raise RemoteFailed("remote_error", f"{where}: the answer is not a JSON object")
    return document


def _texts(parts: Any) -> list[str]:
    return [p["text"] for p in parts or [] if isinstance(p, dict) and isinstance(p.get("text"), str)]


def _read_answer(result: Any, endpoint: Endpoint) -> RemoteAnswer:
    """A task or message from a 1.0 (wrapped by kind) or 0.3 (tagged with ``kind``) answer."""
    if not isinstance(result, dict):
        raise RemoteFailed("remote_error", f"{endpoint.url}: the result is not an object")
    if endpoint.version == wire.V1 and ("task" in result or "message" in result):
        task, message = result.get("task"), result.get("message")
    elif result.get("kind") == "message" or ("role" in result and "parts" in result):
        task, message = None, result
    else:
        task, message = result, None
    if isinstance(message, dict):
        return RemoteAnswer("\n".join(_texts(message.get("parts"))), message.get("taskId"), "COMPLETED",
                            message.get("contextId"), endpoint)
    if not isinstance(task, dict) or not isinstance(task.get("status"), dict):
        raise RemoteFailed("remote_error", f"{endpoint.url}: the result is neither a task nor a message")
    state = str(task["status"].get("state", "")).removeprefix("TASK_STATE_").upper().replace("-", "_")
    text = "\n".join(t for a in task.get("artifacts") or [] if isinstance(a, dict) for t in _texts(a.get("parts")))
    if not text and isinstance(task["status"].get("message"), dict):
        text = "\n".join(_texts(task["status"]["message"].get("parts")))
    return RemoteAnswer(text, task.get("id"), state, task.get("contextId"), endpoint)
