"""The dispatch record of one workflow intent, made from the engine's result."""

from __future__ import annotations

import time

from covenant.clock import iso_now
from covenant.manifest.model import AgentSpec
from covenant.manifest.workflow import Workflow
from covenant.policy.intents import Intent
from covenant.runtime.outcome import DispatchRecord
from covenant.workflow.engine import WorkflowResult

__all__ = ["workflow_record"]


def workflow_record(
    intent: Intent, agent: AgentSpec, workflow: Workflow, result: WorkflowResult | None, started_at: str, t0: float
) -> DispatchRecord:
    """``result`` None: the run was cancelled (the daemon is shutting down)."""
    if result is None:
        outcome, error, text = "cancelled", "covenant stopped the intent: the daemon is shutting down", None
    else:
        outcome, error, text = result.outcome, result.error, result.text
    return DispatchRecord(
        intent_id=intent.id,
        agent_id=agent.id,
        agent_version=agent.version,
        runtime="workflow",
        argv=[],
        limits={"timeout_ms": workflow.timeout_ms, "steps": len(workflow.steps)},
        pid=None,
        started_at=started_at,
        ended_at=iso_now(),
        exit_code=None,
        signal=None,
        outcome=outcome,  # type: ignore[arg-type]
        error=error,
        duration_ms=int((time.monotonic() - t0) * 1000),
        cpu_ms=0,
        peak_rss_kib=0,
        stdout_bytes=0,
        scratch_peak_bytes=0,
        stderr_tail="",
        result={"intent_id": intent.id, "status": "ok", "text": text, "sources": []} if outcome == "ok" else None,
        network_enforced=False,
    )
