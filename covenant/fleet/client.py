"""What the CLI does with the fleet: dispatch an intent over it, show its hosts, find an answer.

Library code: returns documents and raises CovenantErrors; ``covenant.cli.fleet_cmd``
and ``covenant.cli.fleet_dispatch`` print and exit. Routing over the fleet is the
daemon's own (:func:`covenant.daemon.routing.route`: whole-word keywords, bare
names, ``default_agent``), run over the union of the agents the live hosts
publish in ``COVENANT_HOSTS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from covenant.errors import CovenantError, ExitCode
from covenant.fleet.config import FleetConfig
from covenant.fleet.connect import NatsUnreachable, connect
from covenant.fleet.subjects import (
    AUDIT_STREAM,
    HOSTS_BUCKET,
    INTENTS_STREAM,
    MSG_ID_HEADER,
    REPLY_HEADER,
    RESULTS_STREAM,
    audit_subject,
    consumer_name,
    intent_subject,
    result_subject,
)

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js.client import JetStreamContext

__all__ = ["FleetClient", "FleetAgent", "NoLiveHost", "NoAnswer", "default_timeout_s", "fleet_agents"]

_ANSWER_CHECK_S = 2.0
"""While waiting, look in COVENANT_RESULTS this often too (an answer sent while the connection was away)."""
_PUBLISH_FOR_S = 10.0
"""How long a publish is retried while JetStream has no leader for the stream (a NATS node just died)."""


class NoLiveHost(CovenantError):
    """No host that is up runs the agent (or NATS holds no host at all)."""

    code = "no_live_host"
    exit_code = ExitCode.UNREACHABLE


class NoAnswer(CovenantError):
    """No answer came within the timeout."""

    code = "no_answer"
    exit_code = ExitCode.UNREACHABLE


def default_timeout_s(skew_s: int) -> float:
    """``--timeout`` when not given: ``skew_s - 30`` (after that the intent cannot run anywhere), at least half of skew_s."""
    return float(max(skew_s - 30, skew_s / 2))


class FleetAgent(NamedTuple):
    """An agent as the live hosts publish it; ``route`` reads ``keywords`` (and returns the object)."""

    id: str
    keywords: tuple[str, ...]
    hosts: tuple[str, ...]


def fleet_agents(hosts: list[dict[str, Any]]) -> dict[str, FleetAgent]:
    """The union of the agents of ``hosts``: each with every keyword any of its hosts declares."""
    keywords: dict[str, set[str]] = {}
    where: dict[str, list[str]] = {}
    for entry in hosts:
        for agent in entry.get("agents") or []:
            if isinstance(agent, dict) and isinstance(agent.get("id"), str):
                keywords.setdefault(agent["id"], set()).update(k for k in agent.get("keywords") or [] if isinstance(k, str))
                where.setdefault(agent["id"], []).append(str(entry.get("host")))
    return {a: FleetAgent(a, tuple(sorted(keywords[a])), tuple(sorted(where[a]))) for a in sorted(keywords)}


async def _silent(_exc: Exception) -> None:
    """A CLI says once that NATS is unreachable; nats-py's per-attempt errors would repeat it."""


class FleetClient:
    """One connection to the fleet's NATS for one command (``async with``)."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self._nc: Client | None = None

    async def __aenter__(self) -> "FleetClient":
        self._nc = await connect(self.config, "covenant cli", keep_trying=False, error_cb=_silent)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()

    @property
    def nc(self) -> "Client":
        assert self._nc is not None, "use FleetClient in `async with`"
        return self._nc

    @property
    def js(self) -> "JetStreamContext":
        return self.nc.jetstream(timeout=5)

    # -- hosts and routing ---------------------------------------------------------------

    async def hosts(self) -> list[dict[str, Any]]:
        """The live hosts' entries (an entry lives 15 s after its host last wrote it), by host name.

        Read from the bucket's stream, one direct read per key, not with ``KeyValue.keys()``: its
        watcher can end before the last key when entries are written while it reads.
        """
        from nats.js.errors import NotFoundError

        stream = f"KV_{HOSTS_BUCKET}"
        try:
            info = await self.js.stream_info(stream, subjects_filter=f"$KV.{HOSTS_BUCKET}.>")
        except NotFoundError:
            return []
        entries = []
        for subject in sorted(info.state.subjects or {}):
            try:
                raw = await self.js.get_last_msg(stream, subject)
            except NotFoundError:
                continue  # expired meanwhile
            if (raw.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
                continue  # a host that left (its fleet process stopped)
            try:
                document = json.loads(raw.data or b"")
            except ValueError:
                continue
            if isinstance(document, dict):
                entries.append(document)
        return entries

    async def route(self, text: str, requested: str | None, default_agent: str | None) -> tuple[str, str]:
        """The agent id for ``text`` over the live hosts, and how it was chosen; NoLiveHost when none runs it."""
        from covenant.daemon.routing import NoAgent, route

        agents = fleet_agents(await self.hosts())
        try:
            # route() reads only the mapping's keys and each value's .keywords, and returns the value it chose.
            agent, routed_by = route(text, agents, requested=requested, default_agent=default_agent)  # type: ignore[arg-type]
        except NoAgent as exc:
            named = exc.details.get("agent")
            if named is None:
                raise
            raise NoLiveHost(f"no live host of the fleet runs agent {named!r} (`covenant fleet status` lists the hosts "
                             "and their agents)", agent=named) from None
        return agent.id, routed_by

    # -- dispatch ------------------------------------------------------------------------

    async def _publish_intent(self, agent_id: str, intent_id: str, payload: bytes) -> int:
        """Store the intent in COVENANT_INTENTS (replicated before this returns); its stream sequence."""
        from nats.errors import MaxPayloadError, NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout

        deadline = time.monotonic() + _PUBLISH_FOR_S
        while True:
            try:
                ack = await self.js.publish(intent_subject(agent_id), payload, timeout=5,
                                            headers={MSG_ID_HEADER: intent_id, REPLY_HEADER: result_subject(intent_id)})
                return ack.seq
            except MaxPayloadError:
                raise CovenantError(f"the intent is {len(payload)} bytes, more than the NATS servers take in one "
                                    f"message (max_payload {self.nc.max_payload}); shorten it, or raise max_payload "
                                    "in the NATS server configuration") from None
            except (NoRespondersError, NatsTimeout) as exc:
                if time.monotonic() > deadline:
                    raise NatsUnreachable(f"JetStream did not store the intent ({type(exc).__name__}); is the "
                                          "COVENANT_INTENTS stream there and its NATS cluster up?") from None
                await asyncio.sleep(0.5)

    async def answer_of(self, intent_id: str) -> dict[str, Any] | None:
        """The answer of ``intent_id`` in COVENANT_RESULTS (kept 24 h), or None."""
        from nats.js.errors import NotFoundError

        try:
            raw = await self.js.get_last_msg(RESULTS_STREAM, result_subject(intent_id))
        except NotFoundError:
            return None
        document = json.loads(raw.data or b"null")
        return document if isinstance(document, dict) else None

    async def dispatch(self, body: Mapping[str, Any], agent_id: str, timeout_s: float) -> dict[str, Any]:
        """Publish the signed intent for ``agent_id`` and wait up to ``timeout_s`` for its answer."""
        intent_id = body["intent"]["id"]
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        subscription = await self.nc.subscribe(result_subject(intent_id), max_msgs=1)
        try:
            seq = await self._publish_intent(agent_id, intent_id, payload)
            deadline = time.monotonic() + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    msg = await subscription.next_msg(timeout=min(left, _ANSWER_CHECK_S))
                    document = json.loads(msg.data)
                    if isinstance(document, dict):
                        return document
                except (asyncio.TimeoutError, ValueError):
                    pass
                with contextlib.suppress(Exception):
                    found = await self.answer_of(intent_id)
                    if found is not None:
                        return found
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        raise await self._no_answer(intent_id, agent_id, seq, timeout_s)

    async def _no_answer(self, intent_id: str, agent_id: str, seq: int, timeout_s: float) -> NoAnswer:
        """Withdraw the intent from the queue, so that no host starts it after its caller gave up."""
        withdrawn = False
        with contextlib.suppress(Exception):
            withdrawn = await self.js.delete_msg(INTENTS_STREAM, seq)
        if withdrawn:
            return NoAnswer(f"no answer to intent {intent_id} for {agent_id} within {timeout_s:g} s; it was withdrawn "
                            "from the queue, so no host starts it now (one that had already taken it may still run it: "
                            f"`covenant fleet show {intent_id}`; `covenant fleet status` shows the hosts)",
                            intent=intent_id, agent=agent_id)
        return NoAnswer(f"no answer to intent {intent_id} for {agent_id} within {timeout_s:g} s; a host has taken it: "
                        f"`covenant fleet show {intent_id}` shows its answer once there is one",
                        intent=intent_id, agent=agent_id)

    # -- status --------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """Every host (up ones from COVENANT_HOSTS, gone ones from their last audit head), each agent's queue."""
        from nats.js.errors import NotFoundError

        now = int(time.time() * 1000)
        up = await self.hosts()
        hosts: list[dict[str, Any]] = [{**entry, "up": True, "last_seen_ms": entry.get("ts")} for entry in up]
        names = {h.get("host") for h in up}
        with contextlib.suppress(NotFoundError):
            info = await self.js.stream_info(AUDIT_STREAM, subjects_filter="covenant.audit.>")
            for subject in sorted(info.state.subjects or {}):
                raw = await self.js.get_last_msg(AUDIT_STREAM, subject)
                with contextlib.suppress(ValueError):
                    head = json.loads(raw.data or b"")
                    if isinstance(head, dict) and head.get("host") not in names and audit_subject(str(head.get("host"))) == subject:
                        seen = int(raw.time.timestamp() * 1000) if raw.time else None
                        hosts.append({"host": head["host"], "up": False, "last_seen_ms": seen, "agents": [],
                                      "in_flight": 0, "audit_head": {"seq": head.get("seq"), "hash": head.get("hash")}})
        agents = fleet_agents(up)
        queues: list[dict[str, Any]] = []
        with contextlib.suppress(NotFoundError):
            by_consumer = {consumer_name(a): a for a in agents}
            for consumer in await self.js.consumers_info(INTENTS_STREAM):
                name = consumer.name or ""
                agent = by_consumer.get(name)
                queues.append({"agent": agent, "consumer": name, "pending": consumer.num_pending or 0,
                               "in_flight": consumer.num_ack_pending or 0,
                               "hosts": list(agents[agent].hosts) if agent else []})
        listed = {q["agent"] for q in queues}
        queues += [{"agent": a, "consumer": consumer_name(a), "pending": 0, "in_flight": 0, "hosts": list(v.hosts)}
                   for a, v in agents.items() if a not in listed]
        drift = {key: len({h.get(key) for h in up}) > 1 for key in ("grants_digest", "identities_digest", "version")}
        return {"now_ms": now, "hosts": sorted(hosts, key=lambda h: (not h["up"], str(h.get("host")))),
                "agents": sorted(queues, key=lambda q: (q["agent"] is None, q["agent"] or q["consumer"])),
                "drift": drift}
