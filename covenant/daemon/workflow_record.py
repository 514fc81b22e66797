"""The dispatch record of an intent the daemon ran itself (a workflow, a Rune replica call).

No one-shot process of its own: no argv, exit code, signal, CPU or output
counters; the outcome, error and answer text come from the engine.
"""

from __future__ import annotations

from typing import Any

from covenant.manifest.model import AgentSpec
from covenant.manifest.workflow import Workflow
from covenant.policy.intents import Intent
from covenant.runtime.outcome import DispatchRecord
from covenant.workflow.engine import WorkflowResult

__all__ = ["hosted_record", "workflow_record"]


def hosted_record(
    intent: Intent,
    agent: AgentSpec,
    runtime: str,
    limits: dict[str, Any],
    outcome: str,
    error: str | None,
    text: str | None,
    started_at: str,
    t0: float,
    *,
    pid: int | None = None,
    uid: int | None = None,
    session_id: str | None = None,
    usage: dict[str, int] | None = None,
    input_required: bool = False,
) -> DispatchRecord:
    """The record of a run hosted by the daemon; ``t0`` is its ``time.monotonic()`` start; ``pid`` and ``uid``
    those of the process that ran it (a Rune replica; ``uid`` None when it ran as covenant's own);
    ``input_required``: the answer is a question the agent put to the user (``rune@ask-user``)."""
    result = {"intent_id": intent.id, "status": "ok", "text": text, "sources": []} if outcome == "ok" else None
    if result is not None and input_required:
        result["input_required"] = True
    return DispatchRecord.without_process(
        t0=t0,
        intent_id=intent.id,
        agent_id=agent.id,
        agent_version=agent.version,
        runtime=runtime,
        argv=[],
        limits=limits,
        pid=pid,
        isolation="uid" if uid is not None else "same-uid",
        uid=uid,
        started_at=started_at,
        outcome=outcome,
        error=error,
        result=result,
        session_id=session_id,
        usage=usage,
    )


def workflow_record(
    intent: Intent, agent: AgentSpec, workflow: Workflow, result: WorkflowResult | None, started_at: str, t0: float,
    cancel_reason: str | None,
) -> DispatchRecord:
    """``result`` None: the run was cancelled, for ``cancel_reason``."""
    if result is None:
        outcome, error, text = "cancelled", cancel_reason or "covenant stopped the intent", None
    else:
        outcome, error, text = result.outcome, result.error, result.text
    limits = {"timeout_ms": workflow.timeout_ms, "steps": len(workflow.steps)}
    return hosted_record(intent, agent, "workflow", limits, outcome, error, text, started_at, t0)
