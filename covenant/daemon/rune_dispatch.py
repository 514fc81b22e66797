"""One allowed intent to a Rune agent: invoke its replica, make the dispatch record.

The daemon's verify → route → decide → audit path is the same as for any
agent (:mod:`covenant.daemon.service`); this replaces only the one-shot
runner. The intent's ``timeout_ms`` bounds the whole (the replica also gets
the deadline), the answer is redacted per ``safety_policy`` (streamed
tokens line by line), and every way it can end is an outcome of the record. An
answer that is ``rune@ask-user``'s question is outcome ``ok`` with the record's
``result.input_required`` set.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import trio

from covenant.clock import iso_now, now_ms
from covenant.daemon.intent_context import IntentContext
from covenant.daemon.replicas import ReplicaFailed, ReplicaSupervisor
from covenant.daemon.session_keeper import SessionRefused
from covenant.daemon.workflow_record import hosted_record
from covenant.manifest.model import AgentSpec
from covenant.daemon.test_attempts import checked_outcome
from covenant.rune.conversation import new_session_id
from covenant.rune.safety import LineRedactor, redact, still_secret
from covenant.stream_sink import Emit, StreamSink
from covenant.runtime.outcome import OUTCOMES, DispatchRecord
from covenant.workflow.chain import ChainLink

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage
    from covenant.policy.intents import Intent

__all__ = ["run_rune_intent"]


def _relay(sink: StreamSink, policy: str, secrets: list[str]) -> tuple[Emit, Callable[[], Awaitable[None]]]:
    """The replica's events to the client, tokens redacted a line at a time; and the final flush."""
    redactor = LineRedactor(secrets) if policy != "none" else None

    async def relay(event: str, data: dict[str, Any]) -> None:
        if event == "token":
            text = str(data.get("text") or "")
            if redactor is not None:
                text = redactor.feed(text)
            if text:
                await sink.emit("token", {"text": text})
        elif event in ("tool_start", "tool_done"):
            await sink.emit(event, data)

    async def flush() -> None:
        if redactor is not None:
            rest = redactor.flush()
            if rest:
                await sink.emit("token", {"text": rest})

    return relay, flush


async def _write_checkpoint(replicas: ReplicaSupervisor, context: IntentContext, document: dict[str, Any]) -> None:
    """The ``on_finish`` turn the replica answered with, appended to the held session before the intent is
    answered; a turn that is not a list of messages is the replica's protocol error."""
    turn = document.get("checkpoint")
    if turn is None:
        return
    if not isinstance(turn, list) or not all(isinstance(m, dict) for m in turn):
        raise ReplicaFailed("protocol_error", f"the replica of {context.agent.id} answered a checkpoint that is not a list of messages")
    try:
        await replicas.sessions.append(context, turn)
    except OSError as exc:
        raise ReplicaFailed("crashed", f"session {context.session_id} cannot be written: {exc}") from None


async def run_rune_intent(
    replicas: ReplicaSupervisor,
    intent: Intent,
    agent: AgentSpec,
    package: RunePackage,
    *,
    session_id: str | None,
    secrets: Iterable[str],
    sink: StreamSink | None,
    link: ChainLink,
) -> DispatchRecord:
    """Run the intent on the agent's replica; never raises for a fault of the agent or its replica.

    ``link`` is the intent in the daemon's chain: its deadline (trio time) bounds the run further (a child
    intent never outlives its caller), and cancelling it (:meth:`ChainLink.cancel`) ends the run ``cancelled``.
    """
    assert link.run_scope is not None
    cancel_scope = link.run_scope
    rf = package.runefile
    timeout_s = max(0.0, min(rf.timeout_ms / 1000, link.deadline - trio.current_time()))
    session_named = session_id is not None
    session_id = session_id or new_session_id()
    started_at = iso_now()
    t0 = time.monotonic()
    secrets = list(secrets)
    deadline_ms = now_ms() + int(timeout_s * 1000)
    context = IntentContext(intent.id, intent.issuer.pubkey, agent, package, trio.current_time() + timeout_s,
                            session_id=session_id, session_named=session_named, text=intent.text, priority=intent.priority)
    body = {"input": intent.text, "session_id": session_id, "intent_id": intent.id,
            "issuer": intent.issuer.pubkey, "deadline_ms": deadline_ms}
    relay, flush = (None, None) if sink is None else _relay(sink, rf.models.safety_policy, secrets)
    outcome, error, document = "ok", None, {}
    with cancel_scope:
        with trio.move_on_after(timeout_s) as timer:
            try:
                async with replicas.sessions.held(context) as session:
                    if session is not None:
                        body["session"] = session
                    document = await replicas.invoke(agent, package, body, context, emit=relay)
                    if session is not None:
                        await _write_checkpoint(replicas, context, document)
            except SessionRefused as exc:  # the model is never asked
                outcome, error, document = exc.code, exc.message, {"session_id": session_id}
            except ReplicaFailed as exc:
                outcome = exc.outcome if exc.outcome in OUTCOMES else "protocol_error"
                error, document = exc.message, exc.document
        if timer.cancelled_caught:
            outcome, error = "timeout", f"no answer within {int(timeout_s * 1000)} ms (the agent's timeout_ms = {rf.timeout_ms}, or its caller's remaining time)"
    if cancel_scope.cancelled_caught:
        outcome, error = "cancelled", link.cancel_reason or "covenant stopped the intent"
    output = document.get("output") or {}
    text = output.get("text") if outcome == "ok" else None
    outcome, refused, text = checked_outcome(context, outcome, text)
    error = refused or error
    # The replica's word alone does not make a question: the daemon saw the intent's rune@ask-user call.
    input_required = outcome == "ok" and output.get("input_required") is True and context.asked_user
    if text is not None and rf.models.safety_policy != "none":
        text = redact(text, secrets)
        if rf.models.safety_policy == "strict" and still_secret(text, secrets):
            outcome, error, text = "unsafe_output", "the answer still matched a secret pattern after redaction (safety_policy: strict)", None
    if flush is not None and outcome == "ok":
        await flush()
    replica = replicas.replicas.get(agent.id)
    usage = document.get("usage") if isinstance(document.get("usage"), dict) else None
    limits = {
        "timeout_ms": rf.timeout_ms,
        "max_steps": rf.max_steps,
        "token_budget": rf.models.token_budget,
        "request_timeout_ms": rf.runtime.request_timeout_ms,
        "concurrency_limit": rf.runtime.concurrency_limit,
        "resource_profile": rf.runtime.resource_profile,
    }
    return hosted_record(
        intent, agent, "rune", limits, outcome, error, text, started_at, t0,
        pid=replica.pid if replica is not None else None,
        uid=replica.uid if replica is not None else None,
        session_id=document.get("session_id") if isinstance(document.get("session_id"), str) else session_id,
        usage={k: v for k, v in usage.items() if type(v) is int} if usage else None,
        input_required=input_required,
    )
