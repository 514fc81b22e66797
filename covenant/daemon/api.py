"""The control API: a small ASGI app over the daemon (DESIGN.md §7b).

JSON in, JSON out; every error is ``{"error": {"code", "message", ...}}`` with
a fitting HTTP status. Administrative calls (reload; stop, start and restart
of an agent) are allowed only to a peer whose uid is root or the daemon's own
(SO_PEERCRED, see server.py). Dispatch
records are read per user: a peer sees the dispatches it submitted; root, the
daemon's uid and ``[isolation] operators_group`` see all (visibility.py).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import trio

from covenant import outside_json
from covenant.agent_names import resolve_agent_id, resolve_recorded_agent_id
from covenant.spawned_ids import is_spawned_id
from covenant.audit.errors import AuditDataError
from covenant.audit.events import FLEET_DELIVERY, fleet_event_data
from covenant.daemon.agent_status import agent_status
from covenant.daemon.logstream import LogBroadcaster
from covenant.daemon.server import ClientGone, Peer
from covenant.daemon.service import Daemon
from covenant.daemon.status_view import status_document, without_spawned
from covenant.daemon.visibility import sees_every_record
from covenant.errors import CovenantError, error_document
from covenant.runtime.artifacts import ArtifactRefused
from covenant.stream_sink import StreamSink

__all__ = ["ControlAPI"]

log = logging.getLogger("covenant.api")

MAX_BODY_BYTES = 1024 * 1024
LOG_BACKLOG = 200

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class ApiError(CovenantError):
    """A request the API itself refuses (bad JSON, unknown path, forbidden)."""

    def __init__(self, code: str, message: str, http_status: int, **details: Any) -> None:
        super().__init__(message, **details)
        self.code = code
        self.http_status = http_status


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError("bad_request", "client disconnected", 400)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError("bad_request", f"request body over {MAX_BODY_BYTES} bytes", 413)
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send_json(send: Send, status: int, document: Any, *, retry_after_s: int | None = None) -> None:
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _peer(scope: dict) -> Peer | None:
    """The client's SO_PEERCRED credentials, set per connection by server.py."""
    return (scope.get("extensions") or {}).get("covenant.peer")


def _peer_uid(scope: dict) -> int | None:
    peer = _peer(scope)
    return None if peer is None else peer.uid


def _wants_events(scope: dict) -> bool:
    accept = b",".join(v for k, v in scope.get("headers", []) if k.lower() == b"accept")
    return b"text/event-stream" in accept


class ControlAPI:
    """ASGI application; one instance per daemon."""

    def __init__(self, daemon: Daemon, logs: LogBroadcaster,
                 schedules: Callable[[], list[dict[str, Any]]] = list) -> None:
        self.daemon = daemon
        self.logs = logs
        self.schedules = schedules
        """Each schedule with its next and last runs (covenant.triggers.schedules.ScheduleRunner.view)."""
        self._active = 0
        self._quiet = trio.Event()
        self._quiet.set()
        self._routes: list[tuple[str, re.Pattern[str], Callable[..., Awaitable[Any]]]] = [
            ("POST", re.compile(r"/v1/dispatch"), self._dispatch),
            ("GET", re.compile(r"/v1/agents"), self._agents),
            ("GET", re.compile(r"/v1/agents/(?P<agent_id>[^/]+)"), self._agent),
            ("GET", re.compile(r"/v1/agents/(?P<agent_id>.+)/status"), self._agent_status),
            ("POST", re.compile(r"/v1/agents/(?P<agent_id>.+)/stop"), self._stop_agent),
            ("POST", re.compile(r"/v1/agents/(?P<agent_id>.+)/start"), self._start_agent),
            ("POST", re.compile(r"/v1/agents/(?P<agent_id>.+)/restart"), self._restart_agent),
            ("GET", re.compile(r"/v1/status"), self._status),
            ("GET", re.compile(r"/v1/schedules"), self._schedules),
            ("POST", re.compile(r"/v1/reload"), self._reload),
            ("POST", re.compile(r"/v1/replicas/(?P<agent_id>[^/]+)/restart"), self._restart_replica),
            ("GET", re.compile(r"/v1/dispatches"), self._dispatches),
            ("GET", re.compile(r"/v1/dispatches/(?P<intent_id>[^/]+)"), self._dispatch_record),
            ("GET", re.compile(r"/v1/dispatches/(?P<intent_id>[^/]+)/artifacts/(?P<name>[^/]+)"), self._artifact),
            ("POST", re.compile(r"/v1/fleet/events"), self._fleet_event),
        ]

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no lifespan or websocket reaches this app through server.py
        if scope["path"] == "/v1/logs" and scope["method"] == "GET":
            # A log stream may stay open for days: it does not count as a request being answered.
            await self._guarded(self._logs, scope, receive, send)
            return
        self._enter()
        try:
            if scope["path"] == "/v1/dispatch" and scope["method"] == "POST" and _wants_events(scope):
                await self._guarded(self._dispatch_events, scope, receive, send)
                return
            await self._guarded(self._respond, scope, receive, send)
        finally:
            self._leave()

    async def _guarded(self, responder: Callable[..., Awaitable[None]], scope: dict, receive: Receive, send: Send) -> None:
        try:
            await responder(scope, receive, send)
        except ClientGone:
            return  # the caller hung up: nothing to answer (a dispatch has still run to its end and been recorded)
        except CovenantError as exc:
            await _send_json(send, exc.http_status, exc.to_json(), retry_after_s=exc.retry_after_s)
        except Exception:
            log.exception("internal error", extra={"path": scope["path"]})
            await _send_json(send, 500, error_document("internal_error", "internal error; see the daemon log"))

    async def _respond(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["path"] == "/metrics" and scope["method"] == "GET":
            body, content_type = self.daemon.metrics.render()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type.encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        handler, params = self._match(scope["method"], scope["path"])
        await _send_json(send, 200, await handler(scope=scope, receive=receive, **params))

    def _enter(self) -> None:
        if not self._active:
            self._quiet = trio.Event()
        self._active += 1

    def _leave(self) -> None:
        self._active -= 1
        if not self._active:
            self._quiet.set()

    async def wait_requests_done(self) -> None:
        """Wait until no request (other than log streams) is being answered."""
        await self._quiet.wait()

    def _match(self, method: str, path: str) -> tuple[Callable[..., Awaitable[Any]], dict[str, str]]:
        allowed: list[str] = []
        for route_method, pattern, handler in self._routes:
            match = pattern.fullmatch(path)
            if match:
                if route_method == method:
                    return handler, match.groupdict()
                allowed.append(route_method)
        if allowed:
            raise ApiError("method_not_allowed", f"{method} is not allowed on {path}", 405, allowed=allowed)
        raise ApiError("not_found", f"no such endpoint: {path}", 404)

    @staticmethod
    def _query(scope: dict) -> dict[str, str]:
        parsed = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        return {key: values[-1] for key, values in parsed.items()}

    def _require_admin(self, scope: dict) -> None:
        peer = _peer(scope)
        if peer is None or peer.uid not in (0, os.getuid()):
            uid = "unknown" if peer is None else str(peer.uid)
            raise ApiError(
                "forbidden",
                f"administrative call refused for peer uid {uid}: only root or the daemon's uid ({os.getuid()}) may do this",
                403,
            )

    @staticmethod
    async def _json_body(receive: Receive) -> dict[str, Any]:
        raw = await _read_body(receive)
        try:
            body = outside_json.loads(raw, surrogates="refuse")  # a signed intent's text is taken as signed, or refused
        except outside_json.LoneSurrogate as exc:
            raise ApiError("bad_request", f"request body is not Unicode text: {exc}", 400) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError("bad_request", f"request body is not JSON: {exc}", 400) from None
        if not isinstance(body, dict):
            raise ApiError("bad_request", "request body must be a JSON object", 400)
        return body

    async def _dispatch(self, *, scope: dict, receive: Receive) -> Any:
        body = await self._json_body(receive)
        delivery = None
        if isinstance(body, dict) and "fleet" in body:
            # ``covenant fleet`` forwarding a delivery: its fleet.delivery event goes into the intent's own
            # first commit (docs/fleet.md). Administrative, like the events route.
            self._require_admin(scope)
            delivery = self._fleet_delivery(body)
        return await self.daemon.dispatch(body, peer_uid=_peer_uid(scope), fleet_delivery=delivery)

    @staticmethod
    def _fleet_delivery(body: dict[str, Any]) -> dict[str, Any]:
        """The ``fleet.delivery`` data of a forwarded intent: ``fleet`` {delivery, consumer, host} and the
        intent id it claims (the daemon verifies the intent itself next)."""
        fleet = body["fleet"]
        claimed = body.get("intent")
        intent_id = claimed.get("id") if isinstance(claimed, dict) else None
        if not isinstance(fleet, dict):
            raise ApiError("bad_request", "fleet must be an object {delivery, consumer, host}", 400)
        try:
            return fleet_event_data(FLEET_DELIVERY, {"intent": intent_id, **fleet})
        except AuditDataError as exc:
            raise ApiError("bad_request", exc.message, 400) from None

    async def _dispatch_events(self, scope: dict, receive: Receive, send: Send) -> None:
        """A dispatch whose client accepts ``text/event-stream``.

        A Rune agent with ``streaming_enabled`` answers with events ``token``,
        ``tool_start``, ``tool_done`` and finally ``done`` (the outcome document)
        or ``error`` (an error document). Any other dispatch, and any error before
        the first event, is answered as JSON, as without the header.
        """
        body = await self._json_body(receive)

        async def open_stream() -> None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})

        async def emit(event: str, data: Any) -> None:
            frame = f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"
            await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})

        sink = StreamSink(open_stream, emit)
        try:
            outcome = await self.daemon.dispatch(body, sink=sink, peer_uid=_peer_uid(scope))
        except CovenantError as exc:
            if not sink.opened:
                raise
            await sink.emit("error", exc.to_json())
        else:
            if not sink.opened:
                await _send_json(send, 200, outcome)
                return
            await sink.emit("done", outcome)
        if not sink.lost:
            await send({"type": "http.response.body", "body": b""})

    async def _restart_replica(self, *, scope: dict, receive: Receive, agent_id: str) -> Any:
        self._require_admin(scope)
        return await self.daemon.agents.restart_replica(self._named_agent(scope, agent_id, reading=False))

    # -- covenant status AGENT, stop, start, restart --------------------------------------

    def _controlled_agent(self, scope: dict, name: str) -> str:
        """The id NAME means for stop, start and status: a loaded or withdrawn agent, or one still stopped after its
        file went away (so that it can be started, and is shown as stopped)."""
        ids = [*self._visible_ids(scope, reading=True), *(i for i in self.daemon.agents.stopped if not is_spawned_id(i))]
        return resolve_agent_id(name, dict.fromkeys(ids))

    async def _agent_status(self, *, scope: dict, receive: Receive, agent_id: str) -> Any:
        return await self._status_of(scope, self._controlled_agent(scope, agent_id))

    async def _status_of(self, scope: dict, agent_id: str) -> dict[str, Any]:
        """:func:`agent_status` of the resolved ``agent_id``, with its newest dispatch this caller may read."""
        last = await self.daemon.records.recent(1, agent_id, _peer(scope))
        return agent_status(self.daemon, agent_id, last[0] if last else None)

    async def _stop_agent(self, *, scope: dict, receive: Receive, agent_id: str) -> Any:
        self._require_admin(scope)
        found = self._controlled_agent(scope, agent_id)
        if is_spawned_id(found):
            raise ApiError("bad_request", f"{found} was made by rune@agent-spawn: it ends with its spawner's "
                                          "rune@agent-kill or its time to live, it is not stopped", 400)
        changed = await self.daemon.agents.stop(found, peer_uid=_peer_uid(scope))
        return {**await self._status_of(scope, found), "changed": changed}

    async def _start_agent(self, *, scope: dict, receive: Receive, agent_id: str) -> Any:
        self._require_admin(scope)
        found = self._controlled_agent(scope, agent_id)
        changed = await self.daemon.agents.start(found, peer_uid=_peer_uid(scope))
        return {**await self._status_of(scope, found), "changed": changed}

    async def _restart_agent(self, *, scope: dict, receive: Receive, agent_id: str) -> Any:
        self._require_admin(scope)
        found = self._named_agent(scope, agent_id, reading=False)
        restarted = await self.daemon.agents.restart(found, partial(self.daemon.reload, reason="restart"))
        return {**await self._status_of(scope, found), **restarted}

    def _sees_spawned(self, scope: dict) -> bool:
        """Agents made by rune@agent-spawn are their spawner's and issuer's alone: listed for those who see every
        dispatch record (root, the daemon's uid, ``[isolation] operators_group``) only."""
        peer = _peer(scope)
        return peer is not None and sees_every_record(peer, self.daemon.config.isolation.operators_group)

    def _visible_ids(self, scope: dict, *, reading: bool) -> list[str]:
        """The ids of the agents this caller may see; ``reading`` (log lines, records) adds the withdrawn ones,
        whose lines and records exist."""
        loaded = self.daemon.agents.loaded
        everyone = self._sees_spawned(scope)
        ids = [agent_id for agent_id in loaded.agents if everyone or not is_spawned_id(agent_id)]
        return [*ids, *loaded.withdrawn] if reading else ids

    def _named_agent(self, scope: dict, name: str, *, reading: bool) -> str:
        """The id NAME (an id or a bare name: covenant.agent_names) means among :meth:`_visible_ids`; NoAgent or
        AmbiguousRoute otherwise. Not ``reading``, naming a withdrawn agent says which manifest to fix."""
        ids = self._visible_ids(scope, reading=reading)
        return resolve_agent_id(name, ids, withdrawn=None if reading else self.daemon.agents.loaded.withdrawn)

    async def _agents(self, *, scope: dict, receive: Receive) -> Any:
        loaded = self.daemon.agents.loaded
        everyone = self._sees_spawned(scope)
        stopped = self.daemon.agents.stopped
        return {
            "agents": [{**a.model_dump(mode="json"), **loaded.state_of(agent_id), "stopped": agent_id in stopped}
                       for agent_id, a in sorted(loaded.agents.items()) if everyone or not is_spawned_id(agent_id)],
            "problems": [p.to_json() for p in loaded.problems],
            "notes": [n.to_json() for n in loaded.notes],
            "withdrawn": sorted(loaded.withdrawn),
            "stopped": sorted(stopped),
            "spawned": [s.view() for _, s in sorted(self.daemon.agents.spawned.live.items())] if everyone else [],
        }

    async def _agent(self, *, scope: dict, receive: Receive, agent_id: str) -> Any:
        loaded = self.daemon.agents.loaded
        found = self._named_agent(scope, agent_id, reading=False)
        return {**loaded.agents[found].model_dump(mode="json"), **loaded.state_of(found),
                "stopped": found in self.daemon.agents.stopped}

    async def _status(self, *, scope: dict, receive: Receive) -> Any:
        if self.daemon.front_doors is not None:
            self.daemon.front_doors.status_asked(_peer(scope), scope.get("headers", []))
        document = await status_document(self.daemon)
        return document if self._sees_spawned(scope) else without_spawned(document)

    async def _schedules(self, *, scope: dict, receive: Receive) -> Any:
        return {"schedules": self.schedules()}

    async def _reload(self, *, scope: dict, receive: Receive) -> Any:
        self._require_admin(scope)
        return await self.daemon.reload(reason="api")

    async def _dispatches(self, *, scope: dict, receive: Receive) -> Any:
        query = self._query(scope)
        try:
            limit = int(query.get("limit", "20"))
        except ValueError:
            raise ApiError("bad_request", "limit must be an integer", 400) from None
        if not 0 < limit <= 10_000:
            raise ApiError("bad_request", "limit must be between 1 and 10000", 400)
        agent = query.get("agent")
        if agent is not None:
            agent, _ = resolve_recorded_agent_id(agent, self._visible_ids(scope, reading=True))
        records = await self.daemon.records.recent(limit, agent, _peer(scope))
        return {"dispatches": [r.model_dump(mode="json") for r in records]}

    async def _dispatch_record(self, *, scope: dict, receive: Receive, intent_id: str) -> Any:
        record = await self.daemon.records.get(intent_id, _peer(scope))
        if record is None:
            raise ApiError("not_found", f"no dispatch record for intent {intent_id!r}", 404)
        return record.model_dump(mode="json")

    async def _artifact(self, *, scope: dict, receive: Receive, intent_id: str, name: str) -> Any:
        """One file of the intent's record's ``artifacts``, its bytes as base64 (whoever may read the record may
        read its artifacts)."""
        record = await self.daemon.records.get(intent_id, _peer(scope))
        if record is None:
            raise ApiError("not_found", f"no dispatch record for intent {intent_id!r}", 404)
        if not any(entry.get("name") == name for entry in record.artifacts):
            raise ApiError("not_found", f"intent {intent_id} has no artifact {name[:100]!r}", 404)
        store = self.daemon.rune.tools.services.artifacts
        assert store is not None
        try:
            found = await trio.to_thread.run_sync(store.read, intent_id, name)
        except (ArtifactRefused, OSError) as exc:
            raise ApiError("artifact_unreadable", str(exc), 500) from None
        if found is None:
            raise ApiError("artifact_unreadable", f"artifact {name} of intent {intent_id} is in its record but "
                           "not in the artifact store (state/artifacts/ was pruned?)", 410)
        entry, data = found
        return {**entry, "content_base64": base64.b64encode(data).decode("ascii")}

    async def _fleet_event(self, *, scope: dict, receive: Receive) -> Any:
        """Record ``fleet.delivery`` or ``fleet.ack`` for ``covenant fleet``, which holds no key (docs/fleet.md).

        Administrative, like reload: the fleet process runs as root or as the daemon's uid.
        """
        self._require_admin(scope)
        body = await self._json_body(receive)
        try:
            data = fleet_event_data(body.get("type"), body.get("data"))
        except AuditDataError as exc:
            raise ApiError("bad_request", exc.message, 400) from None
        return {"seq": await self.daemon.audit.record(body["type"], data)}

    async def _logs(self, scope: dict, receive: Receive, send: Send) -> None:
        """Server-sent events: recent lines, then (with follow=1) live lines until the client leaves.

        The log names every user's intents and carries agents' stderr: only those who see every
        dispatch record (root, the daemon's uid, ``[isolation] operators_group``) may read it.
        """
        peer = _peer(scope)
        if peer is None or not sees_every_record(peer, self.daemon.config.isolation.operators_group):
            raise ApiError("forbidden", "the daemon's log is for root, the daemon's uid and [isolation] operators_group; "
                                        "`covenant history` shows your own dispatches", 403)
        query = self._query(scope)
        agent, level = query.get("agent"), query.get("level")
        if agent is not None:
            agent = self._named_agent(scope, agent, reading=True)
        follow = query.get("follow", "0") in ("1", "true", "yes")
        try:
            limit = int(query.get("limit", str(LOG_BACKLOG)))
        except ValueError:
            raise ApiError("bad_request", "limit must be an integer", 400) from None
        if not 0 <= limit <= LOG_BACKLOG:
            raise ApiError("bad_request", f"limit must be between 0 and {LOG_BACKLOG}", 400)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            }
        )

        async def emit(entry: dict[str, Any]) -> None:
            data = json.dumps(entry, ensure_ascii=False, separators=(",", ":"))
            await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True})

        if follow:
            # The subscription's backlog and live feed neither overlap nor leave a gap.
            async with self.logs.subscribe(agent=agent, level=level, backlog=limit) as events:
                async for entry in events:
                    await emit(entry)
        else:
            for entry in self.logs.recent(agent=agent, level=level, limit=limit) if limit else ():
                await emit(entry)
        await send({"type": "http.response.body", "body": b""})
