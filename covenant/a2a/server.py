"""The A2A listener: exposed agents served to bearer-token clients (docs/a2a.md).

For each name in ``[a2a] expose`` the base URL ``/a2a/NAME`` answers:

- ``GET  <base>/.well-known/agent-card.json`` the A2A 1.0 card, ``GET <base>/agent-card`` the 0.3 one
  (no token: a card grants nothing; ETag and ``Cache-Control``, 304 for a matching ``If-None-Match``);
- ``POST <base>`` (or ``<base>/``) JSON-RPC: ``SendMessage``, ``SendStreamingMessage``, ``GetTask``,
  ``CancelTask``, ``ListTasks``, ``SubscribeToTask``, and the 0.3 names ``message/send``,
  ``message/stream``, ``tasks/get``, ``tasks/cancel``, ``tasks/resubscribe``;
- the HTTP+JSON binding: ``POST <base>/message:send``, ``POST <base>/message:stream``,
  ``GET <base>/tasks/ID``, ``POST <base>/tasks/ID:cancel``, ``<base>/tasks/ID:subscribe``.

``GET /.well-known/agent.json`` lists the exposed agents' 0.3 cards. Order of
checks: path (404 for an agent not exposed, whatever the token), method (405),
bearer token (401, before any of the body is read), the client's rate (429), the
client's body cap (413). One SendMessage is
one intent, signed by the daemon on behalf of the client's issuer, whose grants
decide it; the task id is the intent id, and a Rune agent's session is the
task's ``contextId``. ``returnImmediately`` answers the task WORKING once it is on
record and runs it in :meth:`A2AApp.run`'s nursery. A Rune agent's
``rune@ask-user`` leaves the task INPUT_REQUIRED; a message naming the task
continues it as a new intent in the same session. Every request but a card read
is audited as ``a2a.request``.
"""

from __future__ import annotations

import hashlib
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

__all__ = ["A2AApp", "Client", "resolve_clients", "CARD_MAX_AGE_S"]

log = logging.getLogger("covenant.daemon")

ArtifactBytes = Callable[[str, str], Awaitable[bytes | None]]
"""``await read(intent_id, name)``: one artifact's bytes from the daemon's store, None when it cannot be read."""

CARD_MAX_AGE_S = 60
"""How long a client may keep a card without asking again (``Cache-Control: max-age``)."""

_RESTORED = frozenset({"a2a.request", "policy.decision"})
_RESTORE_MS = 24 * 3600 * 1000
_CANCEL_WAIT_S = 30
_METHODS_V1 = {"SendMessage": "send", "SendStreamingMessage": "stream", "GetTask": "get", "CancelTask": "cancel",
               "ListTasks": "list"}
_METHODS_V03 = {"message/send": "send", "message/stream": "stream", "tasks/get": "get", "tasks/cancel": "cancel"}
_SUBSCRIBE: dict[str, wire.Version] = {"SubscribeToTask": wire.V1, "tasks/resubscribe": wire.V03}
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


@dataclass
class _Turn:
    """One message to a task: the message, the task it begins or continues, the signed dispatch body."""

    message: wire.IncomingMessage
    entry: TaskEntry
    body: dict[str, Any]


class _EventStream:
    """A ``text/event-stream`` answer: one ``data:`` line per event, JSON-RPC-wrapped or bare (HTTP+JSON).

    A client that hangs up stops the events, never the task: it runs to its end and is recorded."""

    def __init__(self, send: Any, request_id: Any, version: wire.Version, *, jsonrpc: bool) -> None:
        self._send, self._request_id, self._version, self._jsonrpc = send, request_id, version, jsonrpc
        self.lost = False

    async def open(self) -> None:
        await self._send({"type": "http.response.start", "status": 200,
                          "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})

    async def send(self, kind: str, document: dict[str, Any]) -> None:
        if self.lost:
            return
        result = wire.stream_result(kind, document, self._version)  # type: ignore[arg-type]
        data = json.dumps(wire.rpc_result(self._request_id, result) if self._jsonrpc else result,
                          ensure_ascii=False, separators=(",", ":"))
        try:
            await self._send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True})
        except Exception:  # the client hung up
            self.lost = True

    async def close(self) -> None:
        if not self.lost:
            await self._send({"type": "http.response.body", "body": b""})


class A2AApp:
    """The ASGI app of the A2A listener."""

    def __init__(self, config: A2AConfig, clients: list[Client], agents: Callable[[str], AgentFacts | None],
                 signer: OnBehalfSigner, audit: Callable[[str, dict[str, Any]], Awaitable[Any]],
                 daemon: Dispatcher, records: Callable[[str], Awaitable[DispatchRecord | None]],
                 *, store_text: bool, artifact_bytes: ArtifactBytes | None = None) -> None:
        self.config = config
        self.clients = clients
        self.agents = agents
        self.signer = signer
        self.audit = audit
        self.daemon = daemon
        self.records = records
        self.store_text = store_text
        self.artifact_bytes = artifact_bytes
        """Reads one artifact of an intent (``(intent id, name) -> bytes``, None when gone); None: no files are sent."""
        self.ledger = TaskLedger()
        self.refusals = RefusalThrottle(config.audit_refusals_per_minute)
        self._background: trio.Nursery | None = None
        """Where tasks whose client did not wait (``returnImmediately``) run: :meth:`run`'s nursery."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery of the tasks that run after their answer went out, until cancelled (the daemon
        drains their dispatches before it cancels this)."""
        async with trio.open_nursery() as nursery:
            self._background = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._background = None

    def set_clients(self, config: A2AConfig, clients: list[Client]) -> None:
        """Take a reloaded ``[a2a]`` (its listener stays as started): requests from now on are served with the
        new clients, ``expose``, ``public_url`` and caps; a client whose table and token are unchanged keeps
        its rate count, and every client's tasks stay its own."""
        running = {c.config.name: c for c in self.clients}
        self.clients = [old if (old := running.get(c.config.name)) is not None and old.config == c.config
                        and old.token == c.token else c for c in clients]
        if config.audit_refusals_per_minute != self.config.audit_refusals_per_minute:
            self.refusals = RefusalThrottle(config.audit_refusals_per_minute)
        self.config = config

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
                await _send_card(send, scope, {"agents": [card_v03(facts, self._url(name)) for name, facts in self._exposed()]})
                return
            name, rest = _split(path)
            facts = self.agents(name) if name in self.config.expose else None
            if facts is None:
                raise _Refused(404, "not_found", f"no agent is served at {path[:200]!r}")
            url = self._url(name)
            if rest == ".well-known/agent-card.json":
                self._only(method, "GET")
                await _send_card(send, scope, card_v1(facts, url))
                return
            if rest == "agent-card":
                self._only(method, "GET")
                await _send_card(send, scope, card_v03(facts, url))
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
                if method in _SUBSCRIBE:
                    await self._subscribe(call, method, _task_id(request.get("params")), _SUBSCRIBE[method], send,
                                          request_id)
                    return
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
                await self._subscribe(call, "tasks:subscribe", _path_task(rest.removesuffix(":subscribe")), wire.V1,
                                      send, None)
                return
            else:
                result = await self._get(call, "tasks:get", _path_task(rest), wire.V1)
            await _send_json(send, 200, result)
        except wire.RpcError as error:
            await _send_json(send, error.http_status, _http_error(error.http_status, error.message, error.reason,
                                                                  info=error.error_info()))

    # -- the methods -----------------------------------------------------------------------

    async def _open_turn(self, call: _Call, params: Any, version: wire.Version) -> _Turn:
        """The message, and the task it begins or continues with the dispatch body signed on the client's
        issuer's behalf. A message naming a task continues it only while the task waits for input."""
        message = wire.read_message(params, version)
        agent = call.agent.agent
        if message.task_id is not None:
            entry = await self._continued(call, message)
        else:
            entry = None
            context_id = message.context_id or uuid.uuid4().hex
            if agent.runtime == "rune" and not valid_session_id(context_id):
                raise wire.RpcError.invalid_params("contextId must be 1-128 of A-Za-z0-9._- for this agent")
        body = self.signer.body(message.text, agent=agent.id, issuer_display=call.client.config.issuer,
                                issuer_pubkey=call.client.issuer_pubkey, now_ms=now_ms())
        if entry is None:
            entry = self.ledger.add(TaskEntry(body["intent"]["id"], call.client.config.name, context_id, agent.id))
        else:
            entry.next_turn(body["intent"]["id"])
            self.ledger.add(entry)
        if agent.runtime == "rune":
            body["session_id"] = entry.context_id
        return _Turn(message, entry, body)

    async def _continued(self, call: _Call, message: wire.IncomingMessage) -> TaskEntry:
        """The client's task ``message.task_id``, which must be waiting for input; RpcError otherwise.

        Another client's task is not found (the same as one that does not exist). No await comes between
        the state check and the caller's :meth:`TaskEntry.next_turn`: two answers to one question cannot
        both continue it."""
        assert message.task_id is not None
        entry = self.ledger.get(message.task_id, call.client.config.name)
        if entry is None or entry.agent != call.agent.agent.id:
            raise wire.RpcError.task_not_found(message.task_id)
        entry = await self._settled(entry)
        if message.context_id is not None and message.context_id != entry.context_id:
            raise wire.RpcError.invalid_params(f"contextId {message.context_id!r} is not task {entry.task_id}'s "
                                               f"({entry.context_id}); leave it out or send the task's own")
        state = entry.state if entry.done.is_set() else "WORKING"
        if state != wire.INPUT_REQUIRED:
            ended = "has ended" if state in wire.TERMINAL else "is still working"
            raise wire.RpcError.unsupported(f"task {entry.task_id} is {state} ({ended}) and takes no message now; "
                                            "a task takes one only while it waits for input (INPUT_REQUIRED)")
        return entry

    async def _send_message(self, call: _Call, method: str, params: Any, version: wire.Version) -> dict[str, Any]:
        immediate = wire.returns_immediately(params, version)
        if immediate and self._background is None:
            raise wire.RpcError.unsupported("returnImmediately is not served here now; wait for the answer")
        turn = await self._open_turn(call, params, version)
        if immediate:
            assert self._background is not None
            accepted = trio.Event()
            self._background.start_soon(self._run_in_background, call, method, turn, accepted)
            await accepted.wait()  # the task is on record (its a2a.request durable), or it has ended already
            return self._task(turn.entry, version)
        error = await self._dispatch(call, method, turn, sink=None)
        if error is not None:
            raise error
        return await self._full_task(turn.entry, version)

    async def _run_in_background(self, call: _Call, method: str, turn: _Turn, accepted: trio.Event) -> None:
        """A task whose client did not wait (returnImmediately): run to its end in the app's nursery; a refusal
        shows as the task's FAILED status and note (GetTask, SubscribeToTask)."""
        try:
            await self._dispatch(call, method, turn, sink=None, accepted=accepted)
        except Exception:  # a bug: the task still ends, and the listener lives on
            log.exception("a2a task failed inside covenant", extra={"task": turn.entry.task_id})
            if not turn.entry.done.is_set():
                turn.entry.finish("FAILED", answer=None, note="internal_error: covenant failed", at=iso_now())
        finally:
            accepted.set()

    async def _dispatch(self, call: _Call, method: str, turn: _Turn, sink: StreamSink | None,
                        accepted: trio.Event | None = None) -> wire.RpcError | None:
        """Run the turn with its ``a2a.request`` written alongside the intent's first events.

        Both enter the audit writer together and share its group commit (one fsync, not two); the
        answer goes out only after both are durable (``accepted`` is set once the request is). The
        turn's end is the intent's own record.
        """
        error: wire.RpcError | None = None

        async def audit() -> None:
            await self._audit_accepted(call, method, turn)
            if accepted is not None:
                accepted.set()

        async def run() -> None:
            nonlocal error
            try:
                await self._run(call, turn.entry, turn.body, sink)
            except wire.RpcError as exc:
                error = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(audit)
            nursery.start_soon(run)
        return error

    async def _stream(self, call: _Call, method: str, params: Any, version: wire.Version, send: Any,
                      request_id: Any) -> None:
        """SSE: the task (WORKING), the answer as artifact updates (tokens as they come), the final status."""
        turn = await self._open_turn(call, params, version)
        entry = turn.entry
        context_id = entry.context_id
        events = _EventStream(send, request_id, version, jsonrpc=method in ("SendStreamingMessage", "message/stream"))
        held: list[str] = []  # the latest token, sent when the next one shows it was not the last
        sent_any = False

        async def on_token(kind: str, data: dict[str, Any]) -> None:
            nonlocal sent_any
            if kind != "token" or not data.get("text"):
                return
            if held:
                await events.send("artifact-update", wire.artifact_update(entry.task_id, context_id, held.pop(),
                                                                          append=sent_any, last=False, version=version))
                sent_any = True
            held.append(str(data["text"]))

        async def open_stream() -> None:
            return None

        await events.open()
        await events.send("task", wire.task(entry.task_id, context_id, "WORKING", timestamp=iso_now(), version=version))
        # The stream is open: a refusal shows as the entry's FAILED status and its note.
        await self._dispatch(call, method, turn, sink=StreamSink(open_stream, on_token))
        if held or (entry.answer and not sent_any):
            text = held.pop() if held else entry.answer or ""
            await events.send("artifact-update", wire.artifact_update(entry.task_id, context_id, text,
                                                                      append=sent_any, last=True, version=version))
        for file in await self._files(entry, version):
            await events.send("artifact-update", wire.file_update(entry.task_id, context_id, file, version=version))
        await events.send("status-update", wire.status_update(entry.task_id, context_id, entry.state,
                                                              timestamp=entry.updated_at, note=entry.note,
                                                              version=version))
        await events.close()

    async def _subscribe(self, call: _Call, method: str, task_id: str, version: wire.Version, send: Any,
                         request_id: Any) -> None:
        """SSE of a task that has not ended: the task as it stands, then (once its turn ends) its answer and
        its final status. A task waiting for input gets the task alone: nothing comes until its client
        answers. An ended task is refused (-32004), as A2A says; another client's is not found."""
        entry = self.ledger.get(task_id, call.client.config.name)
        if entry is None:
            await self._audit_plain(call, method, task_id, "task_not_found")
            raise wire.RpcError.task_not_found(task_id)
        entry = await self._settled(entry)
        if entry.done.is_set() and entry.state in wire.TERMINAL:
            await self._audit_plain(call, method, task_id, "task_ended")
            raise wire.RpcError.unsupported(f"task {task_id} is {entry.state}: nothing more will come of it; "
                                            "read it with GetTask")
        await self._audit_plain(call, method, task_id, "ok")
        events = _EventStream(send, request_id, version, jsonrpc=method in _SUBSCRIBE)
        await events.open()
        await events.send("task", self._task(entry, version))
        if not entry.done.is_set():
            done = entry.done  # this turn's: a continuation replaces the entry's event with a new one
            await done.wait()
            if entry.answer is not None:
                await events.send("artifact-update", wire.artifact_update(
                    entry.task_id, entry.context_id, entry.answer, append=False, last=True, version=version))
            await events.send("status-update", wire.status_update(
                entry.task_id, entry.context_id, entry.state, timestamp=entry.updated_at, note=entry.note,
                version=version))
        await events.close()

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
        if outcome == "ok" and document.get("input_required") is True:  # rune@ask-user: the question waits
            entry.finish(wire.INPUT_REQUIRED, answer=None, note=str(document.get("text") or ""), at=iso_now())
            return
        record = document.get("record")
        entry.files = list(record.get("artifacts") or []) if isinstance(record, dict) else []
        entry.finish(state_of_outcome(outcome), answer=document.get("text") if outcome == "ok" else None,
                     note=note_of(outcome), at=iso_now())

    def _task(self, entry: TaskEntry, version: wire.Version,
              files: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
        state = entry.state if entry.done.is_set() else "WORKING"
        return wire.task(entry.task_id, entry.context_id, state, timestamp=entry.updated_at or iso_now(),
                         answer=entry.answer, note=entry.note, files=files, version=version)

    async def _files(self, entry: TaskEntry, version: wire.Version) -> tuple[dict[str, Any], ...]:
        """The turn's artifacts as file artifacts, read now (a file gone from the store is left out, logged)."""
        if self.artifact_bytes is None or not entry.done.is_set():
            return ()
        out = []
        for meta in entry.files:
            data = await self.artifact_bytes(entry.intent_id, str(meta.get("name")))
            if data is None:
                log.warning("artifact %s of task %s not sent: not readable", meta.get("name"), entry.task_id)
                continue
            out.append(wire.file_artifact(entry.task_id, str(meta["name"]), str(meta.get("media_type")), data, version))
        return tuple(out)

    async def _full_task(self, entry: TaskEntry, version: wire.Version) -> dict[str, Any]:
        """:meth:`_task` with the turn's files (GetTask, SendMessage's answer)."""
        return self._task(entry, version, await self._files(entry, version))

    async def _settled(self, entry: TaskEntry) -> TaskEntry:
        """A task restored from the audit log: where its current turn ended, read from the dispatch record."""
        if entry.done.is_set() or not entry.restored:  # not restored and not done: it is running now
            return entry
        record = await self.records(entry.intent_id)
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
        return await self._full_task(await self._settled(entry), version)

    async def _cancel(self, call: _Call, method: str, task_id: str, version: wire.Version) -> dict[str, Any]:
        entry = self.ledger.get(task_id, call.client.config.name)
        if entry is None:
            await self._audit_plain(call, method, task_id, "task_not_found")
            raise wire.RpcError.task_not_found(task_id)
        reason = f"A2A client {call.client.config.name} canceled the task"
        entry = await self._settled(entry)
        if entry.done.is_set() and entry.state == wire.INPUT_REQUIRED:  # nothing runs: the question is withdrawn
            entry.finish("CANCELED", answer=None, note=None, at=iso_now())
            await self._audit_plain(call, method, task_id, "ok", settled="CANCELED")
            return self._task(entry, version)
        if entry.done.is_set() or not self.daemon.cancel(entry.intent_id, reason):
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

    async def _audit_accepted(self, call: _Call, method: str, turn: _Turn) -> None:
        entry = turn.entry
        data: dict[str, Any] = {"client": call.client.config.name, "method": method, "agent": entry.agent,
                                "task": entry.task_id, "intent": entry.intent_id, "context": entry.context_id,
                                "outcome": "accepted", "status": 200}
        if self.store_text:
            data["text"] = text_digest(turn.message.text, True)
        await self.audit("a2a.request", data)

    async def _audit_plain(self, call: _Call, method: str, task_id: str | None, outcome: str, *,
                           settled: str | None = None) -> None:
        """A request about a task (GetTask, CancelTask, SubscribeToTask). ``settled``: the state this request
        itself put the task in (a waiting task canceled), kept as ``task`` + ``settled`` so a restart knows."""
        data: dict[str, Any] = {"client": call.client.config.name, "method": method, "agent": call.agent.agent.id,
                                "task": None, "asked_task": task_id, "outcome": outcome, "status": 200}
        if settled is not None:
            data.update(task=task_id, settled=settled)
        await self.audit("a2a.request", data)

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


def _matches(if_none_match: bytes, etag: bytes) -> bool:
    """Does an ``If-None-Match`` header name ``etag`` (or ``*``)? Weak comparison, as RFC 9110 asks for GET."""
    wanted = [tag.strip().removeprefix(b"W/") for tag in if_none_match.split(b",")]
    return b"*" in wanted or etag in wanted


async def _send_card(send: Any, scope: dict, document: Any) -> None:
    """A card with a strong ETag (the SHA-256 of its bytes) and ``Cache-Control: max-age``; 304 with no body
    when the client's ``If-None-Match`` names that ETag. A card changes with a reload, so clients keep it
    for a short while only."""
    data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    etag = b'"' + hashlib.sha256(data).hexdigest().encode() + b'"'
    caching = [(b"etag", etag), (b"cache-control", f"public, max-age={CARD_MAX_AGE_S}".encode())]
    asked = next((v for k, v in scope.get("headers", []) if k == b"if-none-match"), None)
    if asked is not None and _matches(asked, etag):
        await send({"type": "http.response.start", "status": 304, "headers": caching})
        await send({"type": "http.response.body", "body": b""})
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *caching]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _send_json(send: Any, status: int, document: Any, extra: Any = ()) -> None:
    data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
