"""A workflow's plan: its steps grouped in waves with their routes and decisions, as ``dispatch --dry-run``
shows it.

Wave 0 holds the steps with no dependencies; wave n the steps whose last
dependency is in wave n-1. The engine does not wait for whole waves (a step
starts as soon as its own dependencies are done); waves are how a reader
sees what can run side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from covenant.manifest.workflow import Workflow
from covenant.workflow.preflight import StepVerdict

__all__ = ["waves", "workflow_plan"]


def waves(workflow: Workflow) -> list[list[str]]:
    """Step ids by wave (valid, acyclic workflows only), declaration order within a wave."""
    level: dict[str, int] = {}
    by_id = {step.id: step for step in workflow.steps}
    for step_id in workflow.order():
        deps = by_id[step_id].depends_on
        level[step_id] = 1 + max((level[d] for d in deps), default=-1)
    out: list[list[str]] = [[] for _ in range(1 + max(level.values(), default=-1))]
    for step in workflow.steps:
        out[level[step.id]].append(step.id)
    return out


def workflow_plan(workflow: Workflow, verdicts: Sequence[StepVerdict]) -> dict[str, Any]:
    """The dry-run document: waves of steps, each with its route and decision (``verdicts``, from
    :func:`covenant.workflow.preflight.check_workflow`), and the capabilities they need in all."""
    by_id = {step.id: step for step in workflow.steps}
    own = {v.path[0]: v for v in verdicts if len(v.path) == 1}
    plan_waves = []
    for wave in waves(workflow):
        entries = []
        for step_id in wave:
            step, verdict = by_id[step_id], own[step_id]
            entries.append({
                **verdict.to_json(),
                "depends_on": list(step.depends_on),
                "condition": step.condition,
                "timeout_ms": step.timeout_ms,
                "max_attempts": step.retries.max_attempts,
                "capabilities": list(verdict.required),
                "problem": None if verdict.agent is not None else verdict.message,
                "nested": [v.to_json() for v in verdicts if len(v.path) > 1 and v.path[0] == step_id],
            })
        plan_waves.append(entries)
    return {
        "workflow": workflow.name,
        "timeout_ms": workflow.timeout_ms,
        "output_step": workflow.output_step,
        "waves": plan_waves,
        "capabilities": sorted({action for v in verdicts for action in v.required}),
        "allowed": all(v.allowed for v in verdicts),
        "denied": [v.label() for v in verdicts if not v.allowed],
    }
