"""A workflow checked whole before its first step runs: every step's route and decision.

The issuer asked for the whole workflow, so every step it can reach is checked, a step behind a
``condition`` too: which branch runs is known only once earlier steps have answered, and by then
those steps have run and done what they do. So a workflow whose every path the issuer may not walk
is refused before anything spawns, never half-way. A step whose agent runs a workflow of its own
has that workflow's steps checked as well (each such workflow once, so a cycle ends).

The daemon judges each step (:data:`Judge`: the route and the policy decision every intent gets,
one path, no copy of it here); this module walks the steps, and words the refusal. Each step is
still decided again when it runs: a grant revoked mid-run stops the step it covered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from covenant.agent_names import NoAgent
from covenant.manifest.workflow import Workflow, WorkflowStep
from covenant.policy.check import grant_hint
from covenant.policy.errors import PolicyDenied

__all__ = [
    "StepVerdict", "Judge", "WorkflowDenied", "WorkflowUnroutable", "check_workflow", "workflow_refusal", "ROUTING_REASONS",
]

ROUTING_REASONS = frozenset({"no_agent", "ambiguous", "agent_stopped"})
"""Why a step has no agent to run: fixed by loading or starting an agent, not by a grant."""


@dataclass(frozen=True)
class StepVerdict:
    """One step of a workflow, routed and decided for one issuer before anything runs."""

    step: str
    agent_ref: str
    allowed: bool
    agent: str | None = None
    """The agent the step routes to (a remote step: its URL); None when it routes to none."""
    routed_by: str | None = None
    reason: str | None = None
    """Why it may not run: ``capability_denied``, ``budget_exhausted``, ``no_agent``, ``agent_stopped``,
    ``ambiguous``, ``remote``, ``max_depth``, ``remote_agent``."""
    message: str | None = None
    required: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    hint: str | None = None
    """``covenant grant …`` for ``missing``."""
    conditional: bool = False
    """The step has a ``condition``: it may be skipped when the workflow runs, and is checked all the same."""
    path: tuple[str, ...] = ()
    """Step ids from the dispatched workflow down to this step (one id for the workflow's own steps)."""
    workflow: str = ""
    """The name of the workflow that holds the step."""

    def label(self) -> str:
        """``'check'`` or, for a step of a nested workflow, ``'review > check'``."""
        return " > ".join(self.path or (self.step,))

    def to_json(self) -> dict[str, Any]:
        """The step as the dry-run plan, the refusal's details and the ``policy.decision`` event carry it."""
        return {
            "step": self.step,
            "path": list(self.path or (self.step,)),
            "workflow": self.workflow,
            "agent_ref": self.agent_ref,
            "agent": self.agent,
            "routed_by": self.routed_by,
            "conditional": self.conditional,
            "decision": "allow" if self.allowed else "deny",
            "reason": self.reason,
            "message": self.message,
            "required": list(self.required),
            "missing": list(self.missing),
            "hint": self.hint,
        }


Judge = Callable[[WorkflowStep, str, int], tuple[StepVerdict, "Workflow | None"]]
"""``judge(step, caller, depth)``: the step's verdict when run by the agent ``caller`` at chain depth
``depth``, and the workflow the step's agent would run (None for a plain agent)."""


class WorkflowDenied(PolicyDenied):
    """A step of the workflow may not run for this issuer: the workflow is refused before any step runs.

    Details: ``agent`` (the workflow's), ``steps`` (the refused steps, as :meth:`StepVerdict.to_json`),
    ``missing`` (every missing action), ``hint`` (one ``covenant grant …`` for all of them, when any).
    """

    code = "workflow_denied"


class WorkflowUnroutable(NoAgent):
    """No step is denied by policy, but a step names an agent that is not loaded, is stopped or is ambiguous.

    Its code is ``no_agent`` (exit 6, as for a dispatch): loading or starting the agent fixes it, not a grant.
    Details as :class:`WorkflowDenied`'s.
    """


def check_workflow(workflow: Workflow, owner: str, judge: Judge, *, depth: int) -> list[StepVerdict]:
    """Every step of ``workflow`` (run by the agent ``owner`` at chain depth ``depth``) and of the workflows
    its steps run, judged; in declaration order, a nested workflow's steps right after the step that runs it."""
    verdicts: list[StepVerdict] = []
    expanded = {owner}

    def walk(current: Workflow, caller: str, path: tuple[str, ...], at: int) -> None:
        for step in current.steps:
            verdict, inner = judge(step, caller, at + 1)
            here = (*path, step.id)
            verdicts.append(replace(verdict, path=here, workflow=current.name, conditional=step.condition is not None))
            if verdict.allowed and inner is not None and verdict.agent is not None and verdict.agent not in expanded:
                expanded.add(verdict.agent)
                walk(inner, verdict.agent, here, at + 1)

    walk(workflow, owner, (), depth)
    return verdicts


def _line(verdict: StepVerdict) -> str:
    where = verdict.agent or verdict.agent_ref
    branch = ", behind a condition" if verdict.conditional else ""
    if verdict.missing:
        why = f"missing {', '.join(verdict.missing)}"
    else:
        why = f"{verdict.reason}: {verdict.message}"
    return f"  step '{verdict.label()}' ({where}{branch}): {why}"


def workflow_refusal(
    agent_id: str, verdicts: Sequence[StepVerdict], issuer_label: str
) -> WorkflowDenied | WorkflowUnroutable | None:
    """The answer to a workflow some of whose steps may not run (None when every step may).

    ``issuer_label`` names the issuer in the message and the grant command: the name this home knows its
    key by, else the key. A policy refusal of any step makes it ``workflow_denied`` (exit 3), naming the
    steps without an agent too; steps without an agent alone make it ``no_agent`` (exit 6).
    """
    refused = [v for v in verdicts if not v.allowed]
    if not refused:
        return None
    missing = list(dict.fromkeys(action for v in refused for action in v.missing))
    hint = grant_hint(issuer_label, missing) if missing else None
    lines = "\n".join(_line(v) for v in refused)
    total = len(verdicts)
    details: dict[str, Any] = {
        "agent": agent_id, "steps": [v.to_json() for v in refused], "missing": missing, "hint": hint,
    }
    tail = "every step is checked before the first one runs, a step behind a condition too; nothing ran"
    if all(v.reason in ROUTING_REASONS for v in refused):
        return WorkflowUnroutable(
            f"workflow {agent_id} cannot run: {len(refused)} of its {total} steps name no agent that can run\n"
            f"{lines}\n{tail}", **details)
    fix = f"\nan operator can allow the missing actions with: {hint}" if hint else ""
    return WorkflowDenied(
        f"issuer {issuer_label} may not run workflow {agent_id}: {len(refused)} of its {total} steps may not run\n"
        f"{lines}{fix}\n{tail}", **details)
