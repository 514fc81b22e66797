"""The daemon's side of checking a workflow before its first step runs (:mod:`covenant.workflow.preflight`).

Each step is judged as its child intent would be when it runs, by the same functions: routed by
the daemon's one route (the workflow's agent as the caller, so a spawned agent is reached only by
its spawner; a stopped or withdrawn agent is refused as for any intent), held to the child depth
rule, and decided by the policy decision every intent gets (the issuer's grants, then the agent's
budget). A remote step meets the rule its call meets (``[a2a] remotes``, the ``agent.remote`` grant).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from covenant.daemon.child_intents import depth_refusal
from covenant.daemon.remote_calls import REMOTE_ACTION
from covenant.errors import CovenantError
from covenant.manifest.model import AgentSpec
from covenant.manifest.workflow import Workflow, WorkflowStep
from covenant.policy.check import grant_hint
from covenant.workflow.child import agent_from_ref
from covenant.workflow.preflight import StepVerdict, WorkflowDenied, WorkflowUnroutable, check_workflow, workflow_refusal

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage

__all__ = ["WorkflowGate", "workflow_for"]

RouteStep = Callable[[str, str, str], tuple[AgentSpec, str]]
"""``route(name, caller, issuer)``: the agent a step naming ``name`` reaches when the agent ``caller`` runs
it for the key ``issuer``, and how it was chosen; raises CovenantError (``no_agent``, ``agent_stopped``, …)."""
Decide = Callable[[str, AgentSpec, str], tuple[dict[str, Any], "CovenantError | None"]]
"""``decide(issuer, agent, routed_by)``: the ``policy.decision`` data and, when denied, the error."""
RemoteRefusal = Callable[[str, str, str, str], "CovenantError | None"]
"""``refusal(issuer, issuer_label, url, via)``: why a remote call may not be made, or None."""


def workflow_for(
    agent: AgentSpec, workflows: Mapping[str, Workflow], packages: Mapping[str, RunePackage], *, step_of: str | None,
) -> Workflow | None:
    """The workflow an intent to ``agent`` runs: a workflow folder's, or its Rune package's own.

    ``step_of``: the agent whose workflow runs this intent as a step (None for any other intent). A step of a
    package's workflow that names the package's own agent runs that agent's model loop, not the workflow again.
    """
    if agent.runtime == "workflow":
        return workflows[agent.id]
    package = packages.get(agent.id)
    if package is None or package.workflow is None or step_of == agent.id:
        return None
    return package.workflow


class WorkflowGate:
    """Judges every step of a workflow for one issuer (see the module)."""

    def __init__(self, *, route: RouteStep, decide: Decide, remote_refusal: RemoteRefusal,
                 workflow_of: Callable[[AgentSpec, str], Workflow | None], max_depth: Callable[[], int],
                 label: Callable[[str], str]) -> None:
        self._route = route
        self._decide = decide
        self._remote_refusal = remote_refusal
        self._workflow_of = workflow_of
        self._max_depth = max_depth
        self._label = label

    def check(self, workflow: Workflow, owner: AgentSpec, issuer: str, *, depth: int) -> list[StepVerdict]:
        """Every step ``workflow`` (run by ``owner`` at chain depth ``depth``) can reach, judged for ``issuer``."""
        return check_workflow(workflow, owner.id, partial(self._judge, issuer), depth=depth)

    def refusal(self, owner: AgentSpec, verdicts: list[StepVerdict], issuer: str) -> WorkflowDenied | WorkflowUnroutable | None:
        return workflow_refusal(owner.id, verdicts, self._label(issuer))

    def _judge(self, issuer: str, step: WorkflowStep, caller: str, depth: int) -> tuple[StepVerdict, Workflow | None]:
        ref = step.agent_ref
        if ref.startswith(("http://", "https://")):
            return self._judge_remote(issuer, step), None
        try:
            agent, routed_by = self._route(agent_from_ref(ref), caller, issuer)
        except CovenantError as exc:
            return StepVerdict(step.id, ref, False, reason=exc.code, message=exc.message), None
        too_deep = depth_refusal(agent.id, depth, self._max_depth())
        if too_deep is not None:
            return StepVerdict(step.id, ref, False, agent=agent.id, routed_by=routed_by, reason=too_deep.code,
                               message=too_deep.message), None
        decision, denial = self._decide(issuer, agent, routed_by)
        verdict = StepVerdict(
            step.id, ref, denial is None, agent=agent.id, routed_by=routed_by,
            reason=denial.code if denial is not None else None, message=denial.message if denial is not None else None,
            required=tuple(decision["required"]), missing=tuple(decision["missing"]), hint=decision["hint"],
        )
        return verdict, self._workflow_of(agent, caller)

    def _judge_remote(self, issuer: str, step: WorkflowStep) -> StepVerdict:
        label = self._label(issuer)
        refusal = self._remote_refusal(issuer, label, step.agent_ref, "workflow")
        missing = (REMOTE_ACTION,) if refusal is not None and refusal.code == "capability_denied" else ()
        return StepVerdict(
            step.id, step.agent_ref, refusal is None, agent=step.agent_ref, routed_by="url",
            reason=refusal.code if refusal is not None else None, message=refusal.message if refusal is not None else None,
            required=(REMOTE_ACTION,), missing=missing, hint=grant_hint(label, list(missing)) if missing else None,
        )
