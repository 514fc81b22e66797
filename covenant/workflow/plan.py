"""A workflow's plan: its steps grouped in waves, as ``dispatch --dry-run`` shows it.

Wave 0 holds the steps with no dependencies; wave n the steps whose last
dependency is in wave n-1. The engine does not wait for whole waves (a step
starts as soon as its own dependencies are done); waves are how a reader
sees what can run side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from covenant.manifest.model import AgentSpec
from covenant.manifest.workflow import Workflow
from covenant.workflow.child import ChildRefused, agent_from_ref

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


def _resolve(agent_ref: str, find: Callable[[str], AgentSpec | None]) -> tuple[AgentSpec | None, str | None]:
    if agent_ref.startswith(("http://", "https://")):
        return None, None  # a remote agent: its step needs agent.remote, and the URL must be under [a2a] remotes
    try:
        name = agent_from_ref(agent_ref)
    except ChildRefused as exc:
        return None, exc.message
    agent = find(name)
    return agent, None if agent is not None else f"no agent {name!r} is loaded"


def workflow_plan(workflow: Workflow, find: Callable[[str], AgentSpec | None]) -> dict[str, Any]:
    """The dry-run document: waves of steps with their agents and the capabilities those need."""
    by_id = {step.id: step for step in workflow.steps}
    plan_waves = []
    needed: set[str] = set()
    for wave in waves(workflow):
        entries = []
        for step_id in wave:
            step = by_id[step_id]
            agent, problem = _resolve(step.agent_ref, find)
            remote = step.agent_ref.startswith(("http://", "https://"))
            required = ["agent.remote"] if remote else list(agent.capabilities.required) if agent is not None else []
            needed.update(required)
            entries.append({
                "step": step_id,
                "agent": agent.id if agent is not None else None,
                "agent_ref": step.agent_ref,
                "depends_on": list(step.depends_on),
                "condition": step.condition,
                "timeout_ms": step.timeout_ms,
                "max_attempts": step.retries.max_attempts,
                "capabilities": required,
                "problem": problem,
            })
        plan_waves.append(entries)
    return {
        "workflow": workflow.name,
        "timeout_ms": workflow.timeout_ms,
        "output_step": workflow.output_step,
        "waves": plan_waves,
        "capabilities": sorted(needed),
    }

