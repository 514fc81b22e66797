"""One intent delivered to this host, from the pull to the acknowledgement (design/fleet.md §4).

The order is what makes the guarantees:

0. a message whose ``Nats-Msg-Id`` is not its intent's id is dropped unrun (JetStream drops a
   duplicate by that header: a copy under another id is a replay attempt);
1. a redelivery (delivery 2 and up) whose answer is already in ``COVENANT_RESULTS`` is
   acknowledged and not run: the host that answered it died before its ack;
2. the message body goes to ``POST /v1/dispatch`` with its signed intent unchanged and
   ``fleet`` {delivery, consumer, host} beside it: the daemon records ``fleet.delivery`` in
   the intent's own first commit (a body that is no intent document gets the event on its
   own, first); in-progress acks (``+WPI``) go to NATS every ``ack_wait / 3`` meanwhile, so
   only a dead host's intents are redelivered;
3. the daemon's answer (it answers only once the dispatch record is durable) is published
   on ``covenant.result.<id>``: the first answer of an intent is the one kept;
4. ``fleet.ack`` is recorded, then the message is acknowledged (``ack`` for a run, ``term``
   for a refusal) — or, for a 503 (overloaded, shutting down, audit unavailable), NAKed
   with a 1 s delay so a host with room takes it.

An intent this host's daemon refuses as ``replayed_intent`` ran here already: it is
answered from its dispatch record, never run again. On the last delivery an intent
that could still not run here is answered ``delivery_exhausted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from covenant.audit.events import FLEET_ACK, FLEET_DELIVERY
from covenant.client import DaemonUnreachable
from covenant.fleet import answers
from covenant.fleet.daemon_link import Answer, DaemonLink
from covenant.fleet.subjects import INTENTS_STREAM, MSG_ID_HEADER, RESULTS_STREAM, result_subject

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

__all__ = ["Deliveries", "peek", "publish_answer", "answered"]

log = logging.getLogger("covenant.fleet")

NAK_DELAY_S = 1.0
_MAX_SUBJECT_MSGS = 10077  # JetStream: "maximum messages per subject exceeded": the intent has its answer
_PUBLISH_TRIES = 30
_RUN_SETTLE_POLL_S = 0.5


def peek(body: bytes) -> tuple[str | None, str | None]:
    """The intent id and agent a message claims, without trusting either (the daemon verifies)."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, None
    intent = document.get("intent") if isinstance(document, dict) else None
    if not isinstance(intent, dict):
        return None, None
    intent_id, agent = intent.get("id"), intent.get("agent")
    if not isinstance(intent_id, str) or not 0 < len(intent_id) <= 128 or not intent_id.isprintable():
        return None, None
    return intent_id, agent if isinstance(agent, str) else None


async def answered(js: "JetStreamContext", intent_id: str) -> bool:
    """Is there an answer for ``intent_id`` in COVENANT_RESULTS? (False when NATS cannot say.)"""
    from nats.errors import Error as NatsError
    from nats.js.errors import NotFoundError

    try:
        await js.get_last_msg(RESULTS_STREAM, result_subject(intent_id))
    except NotFoundError:
        return False
    except (NatsError, TimeoutError) as exc:
        log.warning("could not check for an earlier answer", extra={"intent": intent_id, "error": repr(exc)})
        return False
    return True


async def publish_answer(js: "JetStreamContext", intent_id: str, document: dict[str, Any], max_bytes: int) -> bool:
    """Publish ``document`` as the answer of ``intent_id``; True once it (or an earlier answer) is stored.

    Retried about once a second while NATS is away (a node restart, a blip); False when it never
    came back within the tries: the intent is then left unacknowledged, so it is redelivered and
    answered again (from this host's record when it comes back here).
    """
    from nats.errors import Error as NatsError
    from nats.js.errors import APIError

    payload = answers.fit(document, max_bytes - 1024)  # room for the headers
    for attempt in range(_PUBLISH_TRIES):
        try:
            await js.publish(result_subject(intent_id), payload, headers={MSG_ID_HEADER: intent_id}, timeout=2)
            return True
        except APIError as exc:
            if exc.err_code == _MAX_SUBJECT_MSGS:
                return True  # answered before (a redelivery, or a race with another host): the first answer stands
            error: Exception = exc
        except (NatsError, TimeoutError) as exc:
            error = exc
        if attempt == 0:
            log.warning("answer not published yet; retrying", extra={"intent": intent_id, "error": repr(error)})
        await asyncio.sleep(1)
    log.error("answer not published; the intent stays unacknowledged and will be redelivered",
              extra={"intent": intent_id})
    return False


@dataclass
class _Running:
    """An intent this host is running now; a redelivery of it (NATS thought us dead) replaces ``msg``."""

    msg: "Msg"
    delivery: int
    started: float = field(default_factory=time.monotonic)
    dispatch_ms: int | None = None
    """How long the daemon took to answer; the rest of the intent's time here is the fleet's."""


@dataclass
class Deliveries:
    """Everything one delivery needs from the fleet process, and the intents running here."""

    host: str
    js: "JetStreamContext"
    daemon: DaemonLink
    max_payload: int
    """The largest message the NATS servers accept (their ``max_payload``)."""
    running: dict[str, _Running] = field(default_factory=dict)

    async def handle(self, msg: "Msg", consumer: str, ack_wait_s: float, max_deliver: int) -> None:
        """Take one delivered message to its acknowledgement (or NAK). Never raises for a bad message."""
        delivery = msg.metadata.num_delivered
        intent_id, agent = peek(msg.data)
        if intent_id is None:
            await self._unanswerable(msg, consumer)
            return
        if (msg.headers or {}).get(MSG_ID_HEADER) != intent_id:
            # Not as `dispatch --fleet` publishes: JetStream's duplicate check keys on this header, so a copy of
            # someone's intent under another Nats-Msg-Id would get past it. Neither run nor answered.
            log.warning("an intent whose Nats-Msg-Id is not its id; dropped, not run", extra={
                "intent": intent_id, "consumer": consumer, "stream_seq": msg.metadata.sequence.stream})
            await msg.term()
            return
        here = self.running.get(intent_id)
        if here is not None:
            # Redelivered while it runs here (our in-progress acks did not reach NATS in time): keep it ours.
            here.msg, here.delivery = msg, delivery
            log.info("redelivered while running here; kept", extra={"intent": intent_id, "delivery": delivery})
            return
        if delivery > 1 and await answered(self.js, intent_id):
            log.info("redelivery of an answered intent; acknowledged", extra={"intent": intent_id, "delivery": delivery})
            await msg.ack()
            return
        self.running[intent_id] = state = _Running(msg, delivery)
        try:
            async with self._keep_alive(state, ack_wait_s):
                await self._run(state, intent_id, agent, consumer, max_deliver)
        finally:
            del self.running[intent_id]

    @contextlib.asynccontextmanager
    async def _keep_alive(self, state: _Running, ack_wait_s: float) -> AsyncIterator[None]:
        """In-progress acks every ack_wait / 3 while the intent is here."""

        async def tick() -> None:
            while True:
                await asyncio.sleep(max(ack_wait_s / 3, 0.2))
                try:
                    await state.msg.in_progress()
                except Exception as exc:  # NATS away for a moment: the next tick tries again
                    log.debug("in-progress ack not sent", extra={"error": repr(exc)})

        task = asyncio.create_task(tick())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, state: _Running, intent_id: str, agent: str | None, consumer: str, max_deliver: int) -> None:
        try:
            delivery = {"delivery": state.delivery, "consumer": consumer, "host": self.host}
            body = _with_delivery(state.msg.data, intent_id, delivery)
            if body is None:  # not an intent document: recorded on its own, and the daemon refuses the rest
                await self.daemon.audit_event(FLEET_DELIVERY, {"intent": intent_id, **delivery})
                body = state.msg.data
            started = time.monotonic()
            reply = await self.daemon.dispatch(body)
            state.dispatch_ms = int((time.monotonic() - started) * 1000)
        except DaemonUnreachable as exc:
            log.warning("the daemon did not answer; the intent is left for a host that can run it",
                        extra={"intent": intent_id, "error": exc.message})
            await self._not_here(state, intent_id, agent, max_deliver, record=False)
            return
        if reply.status == 503:
            log.info("the daemon is full or stopping; the intent is left for a host with room",
                     extra={"intent": intent_id, "code": reply.error_code})
            await self._not_here(state, intent_id, agent, max_deliver, record=True, outcome=reply.error_code)
            return
        if reply.error_code == "replayed_intent":
            await self._from_record(state, intent_id, agent, max_deliver)
            return
        document = answers.answer(self._document(reply), intent_id, self.host, state.delivery)
        await self._finish(state, intent_id, document, ack="ack" if reply.status == 200 else "term")

    @staticmethod
    def _document(reply: Answer) -> dict[str, Any]:
        if isinstance(reply.document, dict):
            return reply.document
        return {"error": {"code": "bad_answer", "message": f"the daemon answered HTTP {reply.status} without a document"}}

    async def _from_record(self, state: _Running, intent_id: str, agent: str | None, max_deliver: int) -> None:
        """A redelivery of an intent this host's daemon saw before: answer it from its record, never run it again."""
        try:
            record = await self.daemon.record(intent_id)
            while record is None and await self._daemon_runs(intent_id):
                await asyncio.sleep(_RUN_SETTLE_POLL_S)  # it runs here still (started before this process)
                record = await self.daemon.record(intent_id)
        except DaemonUnreachable as exc:
            log.warning("the daemon did not answer; the intent is left for a host that can run it",
                        extra={"intent": intent_id, "error": exc.message})
            await self._not_here(state, intent_id, agent, max_deliver, record=False)
            return
        if record is None:
            # Seen here but never run (refused as overloaded or stopping): another host may still run it.
            log.info("seen here before but not run here; left for another host", extra={"intent": intent_id})
            await self._not_here(state, intent_id, agent, max_deliver, record=True, outcome="replayed_intent")
            return
        await self._finish(state, intent_id, answers.from_record(record, self.host, state.delivery), ack="ack")

    async def _daemon_runs(self, intent_id: str) -> bool:
        status = await self.daemon.get("/v1/status")
        return any(entry.get("intent") == intent_id for entry in status.get("in_flight") or [])

    async def _not_here(self, state: _Running, intent_id: str, agent: str | None, max_deliver: int, *,
                        record: bool, outcome: str | None = None) -> None:
        """This host cannot run it now: NAK for another host, or on the last delivery answer delivery_exhausted."""
        if state.delivery >= max_deliver:
            document = answers.delivery_exhausted(intent_id, agent, self.host, state.delivery, max_deliver)
            await self._finish(state, intent_id, document, ack="term")
            return
        if record:
            await self._audit_ack(intent_id, outcome or "not_run", state.delivery, "nak")
        await state.msg.nak(delay=NAK_DELAY_S)

    async def _finish(self, state: _Running, intent_id: str, document: dict[str, Any], *, ack: str) -> None:
        """Publish the answer, record fleet.ack, acknowledge; unacknowledged when the answer could not be stored."""
        if not await publish_answer(self.js, intent_id, document, self.max_payload):
            return
        await self._audit_ack(intent_id, answers.outcome_of(document), state.delivery, ack)
        if ack == "term":
            await state.msg.term()
        else:
            await state.msg.ack()
        log.info("intent answered", extra={"intent": intent_id, "outcome": answers.outcome_of(document),
                                           "delivery": state.delivery, "dispatch_ms": state.dispatch_ms,
                                           "ms": int((time.monotonic() - state.started) * 1000)})

    async def _audit_ack(self, intent_id: str, outcome: str, delivery: int, ack: str) -> None:
        try:
            await self.daemon.audit_event(FLEET_ACK, {"intent": intent_id, "outcome": outcome,
                                                      "delivery": delivery, "ack": ack})
        except DaemonUnreachable as exc:
            # The answer is published and the dispatch record durable; only this event is missing.
            log.error("fleet.ack not recorded", extra={"intent": intent_id, "error": exc.message})

    async def _unanswerable(self, msg: "Msg", consumer: str) -> None:
        """A message with no intent id to answer on: its daemon still sees it (and audits the refusal)."""
        log.warning("a message that is not an intent covenant can answer; dropped",
                    extra={"consumer": consumer, "stream_seq": msg.metadata.sequence.stream})
        with contextlib.suppress(DaemonUnreachable):
            await self.daemon.dispatch(msg.data)
        await msg.term()

    async def exhausted(self, advisory: dict[str, Any]) -> None:
        """JetStream gave up on an intent (``max_deliver`` deliveries, none acknowledged): answer it, drop it."""
        from nats.js.errors import NotFoundError

        seq, deliveries = advisory.get("stream_seq"), advisory.get("deliveries")
        if type(seq) is not int or type(deliveries) is not int:
            return
        try:
            raw = await self.js.get_msg(INTENTS_STREAM, seq)
        except NotFoundError:
            return  # acknowledged or removed meanwhile
        intent_id, agent = peek(raw.data or b"")
        if intent_id is not None and not await answered(self.js, intent_id):
            document = answers.delivery_exhausted(intent_id, agent, self.host, deliveries, deliveries)
            if not await publish_answer(self.js, intent_id, document, self.max_payload):
                return
            log.warning("intent answered delivery_exhausted", extra={"intent": intent_id, "deliveries": deliveries})
        with contextlib.suppress(NotFoundError):
            await self.js.delete_msg(INTENTS_STREAM, seq)


def _with_delivery(data: bytes, intent_id: str, delivery: dict[str, Any]) -> bytes | None:
    """The message's document with ``fleet`` {delivery, consumer, host} beside the signed intent (which is
    unchanged): the daemon writes ``fleet.delivery`` in the intent's own first commit, saving a commit of
    its own per delivery. None when the message is not an intent document naming ``intent_id``."""
    try:
        document = json.loads(data)
    except ValueError:
        return None
    intent = document.get("intent") if isinstance(document, dict) else None
    if not isinstance(intent, dict) or intent.get("id") != intent_id or "fleet" in document:
        return None
    document["fleet"] = delivery
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
