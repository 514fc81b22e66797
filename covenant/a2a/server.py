"""The A2A listener: exposed agents served to bearer-token clients (docs/a2a.md).

For each name in ``[a2a] expose`` the base URL ``/a2a/NAME`` answers:

- ``GET  <base>/.well-known/agent-card.json`` the A2A 1.0 card, ``GET <base>/agent-card`` the 0.3 one
  (no token: a card grants nothing);
- ``POST <base>`` (or ``<base>/``) JSON-RPC: ``SendMessage``, ``SendStreamingMessage``, ``GetTask``,
  ``CancelTask``, ``ListTasks``, and the 0.3 names ``message/send``, ``message/stream``, ``tasks/get``,
  ``tasks/cancel``;
- the HTTP+JSON binding: ``POST <base>/message:send``, ``POST <base>/message:stream``,
  ``GET <base>/tasks/ID``, ``POST <base>/tasks/ID:cancel``.

``GET /.well-known/agent.json`` lists the exposed agents' 0.3 cards. Order of
checks: path (404 for an agent not exposed, whatever the token), method (405),
bearer token (401, before any of the body is read), the client's rate (429), the
client's body cap (413). One SendMessage is
one intent, signed by the daemon on behalf of the client's issuer, whose grants
decide it; the task id is the intent id, and a Rune agent's session is the
task's ``contextId``. Every request but a card read is audited as ``a2a.request``.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from urllib.parse import parse_qsl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from covenant import outside_json
from covenant.a2a import wire
from covenant.a2a.card import AgentFacts, card_v03, card_v1
from covenant.a2a.config import A2AClient, A2AConfig
from covenant.a2a.tasks import TaskEntry, TaskLedger, note_of, state_of_outcome
from covenant.audit.events import text_digest
from covenant.audit.recent import records_since
from covenant.audit.refusals import RefusalThrottle
from covenant.clock import iso_now, now_ms
from covenant.stream_sink import StreamSink
from covenant.errors import ConfigProblems, CovenantError
from covenant.policy.errors import BadIntent, PolicyDenied
from covenant.ratelimit import MinuteRate
from covenant.rune.sessions import valid_session_id
from covenant.runtime.outcome import DispatchRecord
from covenant.triggers.onbehalf import OnBehalfSigner, issuer_pubkey, secret_from_env
from covenant.triggers.webhook_config import rate_per_minute

__all__ = ["A2AApp", "Client", "resolve_clients"]

log = logging.getLogger("covenant.daemon")

_RESTORED = frozenset({"a2a.request", "policy.decision"})
_RESTORE_MS = 24 * 3600 * 1000
_CANCEL_WAIT_S = 30
_METHODS_V1 = {"SendMessage": "send", "SendStreamingMessage": "stream", "GetTask": "get", "CancelTask": "cancel",
               "ListTasks": "list"}
_METHODS_V03 = {"message/send": "send", "message/stream": "stream", "tasks/get": "get", "tasks/cancel": "cancel"}
_PUSH = ("CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
         "DeleteTaskPushNotificationConfig", "tasks/pushNotificationConfig/set", "tasks/pushNotificationConfig/get",
         "tasks/pushNotificationConfig/list", "tasks/pushNotificationConfig/delete")
_HTTP_STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED",
                      409: "FAILED_PRECONDITION", 413: "INVALID_ARGUMENT", 415: "INVALID_ARGUMENT",
                      429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


class Dispatcher(Protocol):
    async def dispatch(self, body: dict[str, Any], *, sink: StreamSink | None = None,
                       daemon_signer: str | None = None) -> dict[str, Any]: ...

    def cancel(self, intent_id: str, reason: str) -> bool: ...


@dataclass(frozen=True)
class Client:
    """A configured client: its token (from the daemon's env) and the issuer it speaks for."""

    config: A2AClient
    token: bytes
    issuer_pubkey: str
    rate: MinuteRate


def resolve_clients(config: A2AConfig, known: dict[str, str], environ: Mapping[str, str]) -> list[Client]:
    """The clients with their tokens; ConfigError naming each client with an unknown issuer or an unset token."""
    clients, problems = [], ConfigProblems()
    for client in config.clients:
        where = f"[[a2a.clients]] {client.name}"
        pubkey = token = None
        with problems.gathered():
            pubkey = issuer_pubkey(known, client.issuer, where=where, field="a2a.clients.issuer")
        with problems.gathered():
            token = secret_from_env(environ, client.token_env, where=where, field="a2a.clients.token_env",
                                    what="the bearer token", min_chars=16)
        if pubkey is not None and token is not None:
            clients.append(Client(client, token.encode(), pubkey, MinuteRate(rate_per_minute(client.rate))))
    problems.raise_any()
    return clients


class _ClientGone(Exception):
    """The client hung up, or was too slow, before its body was whole: there is no one to answer."""


class _Refused(Exception):
    """An HTTP-level refusal, before any JSON-RPC is read."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class _Call:
    """One authenticated request to one exposed agent."""

    client: Client
    agent: AgentFacts


class A2AApp:
    """The ASGI app of the A2A listener."""

    def __init__(self, config: A2AConfig, clients: list[Client], agents: Callable[[str], AgentFacts | None],
                 signer: OnBehalfSigner, audit: Callable[[str, dict[str, Any]], Awaitable[Any]],
                 daemon: Dispatcher, records: Callable[[str], Awaitable[DispatchRecord | None]],
                 *, store_text: bool) -> None:
        self.config = config
        self.clients = clients
        self.agents = agents
        self.signer = signer
        self.audit = audit
        self.daemon = daemon
        self.records = records
        self.store_text = store_text
        self.ledger = TaskLedger()
        self.refusals = RefusalThrottle(config.audit_refusals_per_minute)

    async def restore(self, audit_dir: Any) -> int:
        """Rebuild which task belongs to which client (and which were denied) from the last day's audit log."""
        records = await trio.to_thread.run_sync(records_since, audit_dir, now_ms() - _RESTORE_MS, _RESTORED)
        return self.ledger.restore([(r["type"], r["data"]) for r in reversed(records)])

    # -- HTTP ------------------------------------------------------------------------------

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, method = scope.get("path", ""), scope.get("method", "")
        try:
            if path == "/.well-known/agent.json":
                self._only(method, "GET")
                await _send_json(send, 200, {"agents": [card_v03(facts, self._url(name)) for name, facts in self._exposed()]})
                return
            name, rest = _split(path)
            facts = self.agents(name) if name in self.config.expose else None
            if facts is None:
                raise _Refused(404, "not_found", f"no agent is served at {path[:200]!r}")
            url = self._url(name)
            if rest == ".well-known/agent-card.json":
                self._only(method, "GET")
                await _send_json(send, 200, card_v1(facts, url))
                return
            if rest == "agent-card":
                self._only(method, "GET")
                await _send_json(send, 200, card_v03(facts, url))
                return
            await self._serve_call(scope, receive, send, facts, url, rest)
        except _Refused as refused:
            await self._audit_refusal(refused, client=None, agent=None)
            await _send_json(send, refused.status, _http_error(refused.status, refused.message, refused.code),
                             extra=[(b"www-authenticate", b'Bearer realm="covenant"')] if refused.status == 401 else ())

    async def _serve_call(self, scope: dict, receive: Any, send: Any, facts: AgentFacts, url: str, rest: str) -> None:
        method = scope.get("method", "")
        binding = "jsonrpc" if rest == "" else "http+json"
        if binding == "jsonrpc" or rest in ("message:send", "message:stream") or rest.endswith(":cancel"):
            self._only(method, "POST")
        elif rest == "tasks" or rest.startswith("tasks/"):
            if method not in ("GET", "POST"):
                raise _Refused(405, "method_not_allowed", "this A2A path answers GET and POST only")
        else:
            raise _Refused(404, "not_found", f"no A2A route {rest!r} under {url}")
        client = self._authenticate(scope)  # before any of the body is read
        try:
            if client.rate.over(time.monotonic()):
                raise _Refused(429, "rate_limited", f"client {client.config.name} may send {client.config.rate}")
            body = await self._body(scope, receive, client)
            if outside_json.holds_lone_surrogate(body):  # it would fail the intent's signing and its records
                raise _Refused(400, "bad_body", "the body holds a lone surrogate (such as \\ud800): "
                                                "send valid Unicode text")
        except _ClientGone:
            return
        except _Refused as refused:
            await self._audit_refusal(refused, client=client, agent=facts.agent.id)
            await _send_json(send, refused.status, _http_error(refused.status, refused.message, refused.code))
            return
        call = _Call(client, facts)
        if binding == "jsonrpc":
            await self._jsonrpc(call, scope, body, send)
        else:
            await self._http_json(call, scope, rest, body, send)

    def _only(self, method: str, allowed: str) -> None:
        if method != allowed:
            raise _Refused(405, "method_not_allowed", f"this A2A path answers {allowed} only")

    async def _body(self, scope: dict, receive: Any, client: Client) -> bytes:
        cap_kb = client.config.max_body_kb or self.config.max_body_kb
        too_large = _Refused(413, "body_too_large", f"the body is over {cap_kb} KiB, the most client "
                                                    f"{client.config.name} may send (max_body_kb)")
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > cap_kb * 1024:
                raise too_large
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap_kb * 1024:
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    def _authenticate(self, scope: dict) -> Client:
        header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
        scheme, _, token = header.partition(b" ")
        found = None
        if scheme.lower() == b"bearer" and token:
            for client in self.clients:  # every token is compared: the time taken does not say which matched
                if hmac.compare_digest(client.token, token.strip()):
                    found = client
        if found is None:
            raise _Refused(401, "unauthorized", "send Authorization: Bearer <token> with a token of [[a2a.clients]]")
        return found

    def _exposed(self) -> list[tuple[str, AgentFacts]]:
        return [(name, facts) for name in self.config.expose if (facts := self.agents(name)) is not None]

    def _url(self, name: str) -> str:
        return f"{self.config.base_url()}/a2a/{name}"

    # -- JSON-RPC --------------------------------------------------------------------------

    async def _jsonrpc(self, call: _Call, scope: dict, body: bytes, send: Any) -> None:
        request_id: Any = None
        try:
            _check_headers(scope)
            try:
                request = outside_json.loads(body)
            except ValueError as exc:
                raise wire.RpcError.parse(f"the body is not JSON: {exc}") from None
            if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or not isinstance(request.get("method"), str):
                raise wire.RpcError.invalid_request('a JSON-RPC 2.0 request needs "jsonrpc": "2.0" and a string "method"')
            request_id = request.get("id")
            if request_id is not None and not isinstance(request_id, (str, int)):
                request_id = None
                raise wire.RpcError.invalid_request("id must be a string, a number or absent")
            method = request["method"]
            version: wire.Version = wire.V03 if method in _METHODS_V03 else wire.V1
            action = _METHODS_V1.get(method) or _METHODS_V03.get(method)
            if action is None:
                if method in _PUSH:
                    raise wire.RpcError.push_not_supported()
                if method in ("SubscribeToTask", "tasks/resubscribe"):
                    if self.ledger.get(_task_id(request.get("params")), call.client.config.name) is None:
                        raise wire.RpcError.task_not_found(request["params"]["id"])
                    raise wire.RpcError.unsupported("subscribing to a task is not supported; use GetTask")
                if method in ("GetExtendedAgentCard", "agent/getAuthenticatedExtendedCard"):
                    raise wire.RpcError(-32007, "covenant serves no extended agent card", 400)
                raise wire.RpcError.method_not_found(method)
            params = request.get("params", {})
            if action == "stream":
                await self._stream(call, method, params, version, send, request_id)
                return
            result = await self._answer(call, method, action, params, version)
            await _send_json(send, 200, wire.rpc_result(request_id, result))
        except wire.RpcError as error:
            await _send_json(send, 200, wire.rpc_error(request_id, error))

    async def _answer(self, call: _Call, method: str, action: str, params: Any, version: wire.Version) -> Any:
        if action == "send":
            return wire.send_result(await self._send_message(call, method, params, version), version)
        if action == "list":
            return self._list(call, params)
        task_id = _task_id(params)
        if action == "get":
            return await self._get(call, method, task_id, version)
        return await self._cancel(call, method, task_id, version)

    # -- HTTP+JSON -------------------------------------------------------------------------

    async def _http_json(self, call: _Call, scope: dict, rest: str, body: bytes, send: Any) -> None:
        try:
            _check_headers(scope)
            if rest in ("message:send", "message:stream"):
                try:
                    params = outside_json.loads(body)
                except ValueError as exc:
                    raise wire.RpcError.parse(f"the body is not JSON: {exc}") from None
                if rest == "message:stream":
                    await self._stream(call, "message:stream", params, wire.V1, send, None)
                    return
                result = wire.send_result(await self._send_message(call, "message:send", params, wire.V1), wire.V1)
            elif rest.endswith(":cancel"):
                result = await self._cancel(call, "tasks:cancel", _path_task(rest.removesuffix(":cancel")), wire.V1)
            elif rest == "tasks":
                result = self._list(call, _query_params(scope))
            elif "/pushNotificationConfigs" in rest:
                raise wire.RpcError.push_not_supported()
            elif rest.endswith(":subscribe"):
                task_id = _path_task(rest.removesuffix(":subscribe"))
                if self.ledger.get(task_id, call.client.config.name) is None:
                    raise wire.RpcError.task_not_found(task_id)
                raise wire.RpcError.unsupported("subscribing to a task is not supported; use GET tasks/ID")
            else:
                result = await self._get(call, "tasks:get", _path_task(rest), wire.V1)
            await _send_json(send, 200, result)
        except wire.RpcError as error:
            await _send_json(send, error.http_status, _http_error(error.http_status, error.message, error.reason,
                                                                  info=error.error_info()))

    # -- the methods -----------------------------------------------------------------------

    def _prepare(self, call: _Call, params: Any, version: wire.Version) -> tuple[wire.IncomingMessage, str, dict[str, Any]]:
        """The message, its context id and the dispatch body signed on the client's issuer's behalf."""
        message = wire.read_message(params, version)
        if message.task_id is not None:
            known = self.ledger.get(message.task_id, call.client.config.name)
            if known is None:
                raise wire.RpcError.task_not_found(message.task_id)
            raise wire.RpcError.unsupported(f"task {message.task_id} cannot take more input; send a new message "
                                            "without taskId (the same contextId continues the conversation)")
        agent = call.agent.agent
        context_id = message.context_id or uuid.uuid4().hex
        if agent.runtime == "rune" and not valid_session_id(context_id):
            raise wire.RpcError.invalid_params("contextId must be 1-128 of A-Za-z0-9._- for this agent")
        body = self.signer.body(message.text, agent=agent.id, issuer_display=call.client.config.issuer,
                                issuer_pubkey=call.client.issuer_pubkey, now_ms=now_ms())
        if agent.runtime == "rune":
            body["session_id"] = context_id
        return message, context_id, body

    async def _send_message(self, call: _Call, method: str, params: Any, version: wire.Version) -> dict[str, Any]:
        message, context_id, body = self._prepare(call, params, version)
        entry = self._begin(call, body, context_id)
        error = await self._dispatch(call, method, entry, body, message.text, sink=None)
        if error is not None:
            raise error
        return self._task(entry, version)

    async def _dispatch(self, call: _Call, method: str, entry: TaskEntry, body: dict[str, Any], text: str,
                        sink: StreamSink | None) -> wire.RpcError | None:
        """Run the task with its ``a2a.request`` written alongside the intent's first events.

        Both enter the audit writer together and share its group commit (one fsync, not two); the
        answer goes out only after both are durable. The task's end is the intent's own record.
        """
        error: wire.RpcError | None = None

        async def run() -> None:
            nonlocal error
            try:
                await self._run(call, entry, body, sink)
            except wire.RpcError as exc:
                error = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._audit_accepted, call, method, entry, text)
            nursery.start_soon(run)
        return error

    async def _stream(self, call: _Call, method: str, params: Any, version: wire.Version, send: Any,
                      request_id: Any) -> None:
        """SSE: the task (WORKING), the answer as artifact updates (tokens as they come), the final status."""
        message, context_id, body = self._prepare(call, params, version)
        entry = self._begin(call, body, context_id)
        jsonrpc = method in ("SendStreamingMessage", "message/stream")
        lost = False

        async def event(kind: str, document: dict[str, Any]) -> None:
            nonlocal lost
            if lost:
                return
            result = wire.stream_result(kind, document, version)  # type: ignore[arg-type]
            data = json.dumps(wire.rpc_result(request_id, result) if jsonrpc else result, ensure_ascii=False,
                              separators=(",", ":"))
            try:
                await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True})
            except Exception:  # the client hung up: the task still runs to its end and is recorded
                lost = True

        held: list[str] = []  # the latest token, sent when the next one shows it was not the last
        sent_any = False

        async def on_token(kind: str, data: dict[str, Any]) -> None:
            nonlocal sent_any
            if kind != "token" or not data.get("text"):
                return
            if held:
                await event("artifact-update", wire.artifact_update(entry.task_id, context_id, held.pop(),
                                                                    append=sent_any, last=False, version=version))
                sent_any = True
            held.append(str(data["text"]))

        async def open_stream() -> None:
            return None

        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        await event("task", wire.task(entry.task_id, context_id, "WORKING", timestamp=iso_now(), version=version))
        # The stream is open: a refusal shows as the entry's FAILED status and its note.
        await self._dispatch(call, method, entry, body, message.text, sink=StreamSink(open_stream, on_token))
        if held or (entry.answer and not sent_any):
            text = held.pop() if held else entry.answer or ""
            await event("artifact-update", wire.artifact_update(entry.task_id, context_id, text, append=sent_any,
                                                                last=True, version=version))
        await event("status-update", wire.status_update(entry.task_id, context_id, entry.state,
                                                        timestamp=entry.updated_at, note=entry.note, version=version))
        if not lost:
            await send({"type": "http.response.body", "body": b""})

    def _begin(self, call: _Call, body: dict[str, Any], context_id: str) -> TaskEntry:
        return self.ledger.add(TaskEntry(body["intent"]["id"], call.client.config.name, context_id, call.agent.agent.id))

    async def _run(self, call: _Call, entry: TaskEntry, body: dict[str, Any], sink: StreamSink | None) -> None:
        """Dispatch and settle the entry; a denial is a REJECTED task, other refusals a JSON-RPC error."""
        try:
            document = await self.daemon.dispatch(body, sink=sink, daemon_signer=self.signer.pubkey)
        except PolicyDenied as denied:
            entry.finish("REJECTED", answer=None, note=f"{denied.code}: {denied.message}", at=iso_now())
            return
        except BadIntent as bad:
            entry.finish("FAILED", answer=None, note=f"{bad.code}: {bad.message}", at=iso_now())
            raise wire.RpcError.invalid_params(bad.message) from None
        except CovenantError as exc:
            entry.finish("FAILED", answer=None, note=f"{exc.code}: {exc.message}", at=iso_now())
            raise wire.RpcError(-32603, exc.message, exc.http_status, {"code": exc.code}) from None
        except BaseException:
            entry.finish("FAILED", answer=None, note="internal_error: covenant failed", at=iso_now())
            raise
        outcome = document["outcome"]
        entry.finish(state_of_outcome(outcome), answer=document.get("text") if outcome == "ok" else None,
                     note=note_of(outcome), at=iso_now())

    def _task(self, entry: TaskEntry, version: wire.Version) -> dict[str, Any]:
        state = entry.state if entry.done.is_set() else "WORKING"
        return wire.task(entry.task_id, entry.context_id, state, timestamp=entry.updated_at or iso_now(),
                         answer=entry.answer, note=entry.note, version=version)

    async def _settled(self, entry: TaskEntry) -> TaskEntry:
        """A task restored from the audit log: its end read from the dispatch record."""
        if entry.done.is_set() or not entry.restored:  # not restored and not done: it is running now
            return entry
        record = await self.records(entry.task_id)
        if record is not None:
            entry.settle_from(record)
        else:
            entry.finish("FAILED", answer=None, note="interrupted: the daemon stopped before this task ended", at="")
        return entry

    async def _get(self, call: _Call, method: str, task_id: str, version: wire.Version) -> dict[str, Any]:
        entry = self.ledger.get(task_id, call.client.config.name)
        outcome = "ok" if entry is not None else "task_not_found"
        await self._audit_plain(call, method, task_id, outcome)
        if entry is None:
            raise wire.RpcError.task_not_found(task_id)
        return self._task(await self._settled(entry), version)

    async def _cancel(self, call: _Call, method: str, task_id: str, version: wire.Version) -> dict[str, Any]:
        entry = self.ledger.get(task_id, call.client.config.name)
        if entry is None:
            await self._audit_plain(call, method, task_id, "task_not_found")
            raise wire.RpcError.task_not_found(task_id)
        if entry.done.is_set() or not self.daemon.cancel(task_id, f"A2A client {call.client.config.name} canceled the task"):
            entry = await self._settled(entry)
            await self._audit_plain(call, method, task_id, "not_cancelable")
            raise wire.RpcError.not_cancelable(task_id, entry.state)
        with trio.move_on_after(_CANCEL_WAIT_S):
            await entry.done.wait()
        await self._audit_plain(call, method, task_id, "ok")
        return self._task(entry, version)

    def _list(self, call: _Call, params: Any) -> dict[str, Any]:
        if not isinstance(params, dict):
            raise wire.RpcError.invalid_params("params must be an object")
        context_id = params.get("contextId") or None
        size = params.get("pageSize") or 50
        if not isinstance(size, int) or not 1 <= size <= 100:
            raise wire.RpcError.invalid_params("pageSize must be 1 … 100")
        tasks = [self._task(e, wire.V1) for e in self.ledger.of_client(call.client.config.name, context_id)]
        if params.get("includeArtifacts") is not True:  # A2A's default: tasks listed without their artifacts
            for task in tasks:
                task.pop("artifacts", None)
        return {"tasks": tasks[:size], "nextPageToken": "", "pageSize": size, "totalSize": len(tasks)}

    # -- audit -----------------------------------------------------------------------------

    async def _audit_accepted(self, call: _Call, method: str, entry: TaskEntry, text: str) -> None:
        data: dict[str, Any] = {"client": call.client.config.name, "method": method, "agent": entry.agent,
                                "task": entry.task_id, "context": entry.context_id, "outcome": "accepted",
                                "status": 200}
        if self.store_text:
            data["text"] = text_digest(text, True)
        await self.audit("a2a.request", data)

    async def _audit_plain(self, call: _Call, method: str, task_id: str | None, outcome: str) -> None:
        await self.audit("a2a.request", {"client": call.client.config.name, "method": method,
                                         "agent": call.agent.agent.id, "task": None, "asked_task": task_id,
                                         "outcome": outcome, "status": 200})

    async def _audit_refusal(self, refused: _Refused, *, client: Client | None, agent: str | None) -> None:
        suppressed = self.refusals.admit(refused.code)
        if suppressed is not None:
            log.warning("a2a request refused", extra={"client": client.config.name if client else None,
                                                      "agent": agent, "code": refused.code, "status": refused.status})
            await self.audit("a2a.request", {"client": client.config.name if client else None, "method": None,
                                             "agent": agent, "task": None, "outcome": refused.code,
                                             "status": refused.status, "suppressed": suppressed})


def _split(path: str) -> tuple[str, str]:
    """``/a2a/NAME/REST`` -> (NAME, REST); ('', '') for any other path."""
    if not path.startswith("/a2a/"):
        return "", ""
    name, _, rest = path[len("/a2a/"):].partition("/")
    return name, rest.rstrip("/")


def _check_headers(scope: dict) -> None:
    """A body that is not JSON by its Content-Type, or an A2A-Version covenant does not speak: A2A errors."""
    headers = dict(scope.get("headers", []))
    version = headers.get(b"a2a-version")
    if version is not None and version.decode("latin-1").strip() not in ("1.0", "1.0.0", "1", "0.3", "0.3.0"):
        raise wire.RpcError.version(version.decode("latin-1")[:20])
    content_type = headers.get(b"content-type")
    if scope.get("method") == "POST" and content_type is not None:
        media = content_type.decode("latin-1").split(";")[0].strip().lower()
        if media not in ("application/json", "application/a2a+json"):
            raise wire.RpcError.content_type(f"send the body as application/json, not {media[:60]!r}")


def _task_id(params: Any) -> str:
    if not isinstance(params, dict) or not isinstance(params.get("id"), str) or not params["id"]:
        raise wire.RpcError.invalid_params("params.id must be the task id")
    return params["id"]


def _query_params(scope: dict) -> dict[str, Any]:
    """ListTasks' query string (``contextId``, ``pageSize``) as JSON-RPC params."""
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    params: dict[str, Any] = {}
    if query.get("contextId"):
        params["contextId"] = query["contextId"]
    if query.get("includeArtifacts"):
        params["includeArtifacts"] = query["includeArtifacts"].lower() == "true"
    if query.get("pageSize"):
        if not query["pageSize"].isdigit():
            raise wire.RpcError.invalid_params("pageSize must be 1 … 100")
        params["pageSize"] = int(query["pageSize"])
    return params


def _path_task(rest: str) -> str:
    task_id = rest.removeprefix("tasks/")
    if not task_id or "/" in task_id:
        raise wire.RpcError.task_not_found(task_id)
    return task_id


def _http_error(status: int, message: str, reason: str, *, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """An error as the HTTP+JSON binding spells it (google.rpc.Status with an ErrorInfo detail)."""
    detail = info or {"@type": wire.ERROR_INFO_TYPE, "reason": reason.upper(), "domain": "covenant"}
    return {"error": {"code": status, "status": _HTTP_STATUS_NAMES.get(status, "UNKNOWN"), "message": message,
                      "details": [detail]}}


async def _send_json(send: Any, status: int, document: Any, extra: Any = ()) -> None:
    data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
