"""The workflow DAG engine: run each step once its dependencies are done, side by side.

Every step runs in one trio nursery and waits for its own dependencies, so
steps that do not depend on each other overlap. A step whose ``condition``
does not hold is skipped (its output is the empty string; steps after it
still run). A failed step is retried per its ``retries``; when it still
fails, the other steps are cancelled and the workflow fails naming it.
The whole run ends by ``deadline`` (the workflow's ``timeout_ms``, never
past the calling intent's time).

The engine knows nothing of intents: ``run_step`` (the daemon's child
intent path) runs one attempt of one step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from covenant.manifest.workflow import StepRetries, Workflow, WorkflowStep, parse_condition
from covenant.workflow.template import is_template, render

__all__ = ["StepResult", "StepState", "WorkflowResult", "run_workflow", "NEVER_RETRIED", "backoff_s"]

NEVER_RETRIED = frozenset({
    "capability_denied", "budget_exhausted", "network", "max_depth", "no_agent", "agent_stopped", "no_parent",
    "remote_agent", "remote", "remote_rejected", "text_too_long", "session_forbidden", "cancelled", "workflow_not_supported",
})
"""Outcomes that are refusals (or a shutdown): another attempt would get the same answer."""

_BACKOFF_BASE_MS = 200
_BACKOFF_MAX_MS = 5000
_GRACE_S = 10.0
"""Past the deadline, how long steps get to record their own ``timeout`` (they end by the deadline themselves)."""


@dataclass(frozen=True)
class StepResult:
    """One attempt of one step, as the daemon ran it."""

    outcome: str
    text: str | None = None
    error: str | None = None
    intent_id: str | None = None


@dataclass
class StepState:
    status: str = "pending"
    """pending | running | ok | skipped | failed | cancelled"""
    attempts: int = 0
    last: StepResult | None = None


@dataclass
class WorkflowResult:
    outcome: str
    """``ok``, ``step_failed`` or ``timeout``."""
    text: str | None
    error: str | None
    failed_step: str | None = None
    steps: dict[str, StepState] = field(default_factory=dict)


RunStep = Callable[[WorkflowStep, str], Awaitable[StepResult]]
"""Run one attempt of a step with its rendered input; never raises for the step's own failure."""


def backoff_s(retries: StepRetries, retry: int) -> float:
    """Seconds before retry number ``retry`` (1 = the second attempt)."""
    if retries.backoff == "none":
        return 0.0
    if retries.backoff == "fixed":
        return _BACKOFF_BASE_MS / 1000
    return min(_BACKOFF_BASE_MS * 2 ** (retry - 1), _BACKOFF_MAX_MS) / 1000


def _retryable(retries: StepRetries, outcome: str) -> bool:
    if outcome in NEVER_RETRIED:
        return False
    return not retries.on or outcome in retries.on


def _condition_holds(step: WorkflowStep, outputs: dict[str, str]) -> bool:
    if step.condition is None:
        return True
    condition = parse_condition(step.condition)
    if condition is None:  # rejected at load; never reached for a loaded workflow
        return False
    return condition.holds(outputs.get(condition.step, ""))


class _Run:
    def __init__(self, workflow: Workflow, input_text: str, run_step: RunStep, deadline: float) -> None:
        self.workflow = workflow
        self.deadline = deadline
        self.input_text = input_text
        self.run_step = run_step
        self.outputs: dict[str, str] = {}
        self.states = {step.id: StepState() for step in workflow.steps}
        self.done = {step.id: trio.Event() for step in workflow.steps}
        self.failed: tuple[str, StepResult] | None = None

    async def step(self, step: WorkflowStep, cancel: trio.CancelScope) -> None:
        state = self.states[step.id]
        for dep in step.depends_on:
            await self.done[dep].wait()
        if not _condition_holds(step, self.outputs):
            state.status = "skipped"
            self.outputs[step.id] = ""
            self.done[step.id].set()
            return
        text = render(step.input_template, self.input_text, self.outputs)
        state.status = "running"
        while True:
            state.attempts += 1
            result = await self.run_step(step, text)
            state.last = result
            if result.outcome == "ok":
                state.status = "ok"
                self.outputs[step.id] = result.text or ""
                self.done[step.id].set()
                return
            if state.attempts >= step.retries.max_attempts or not _retryable(step.retries, result.outcome):
                break
            pause = backoff_s(step.retries, state.attempts)
            if trio.current_time() + pause >= self.deadline:
                break
            await trio.sleep(pause)
        state.status = "failed"
        if self.failed is None:
            self.failed = (step.id, result)
        cancel.cancel()

    def output(self) -> str:
        chosen = self.workflow.output_step
        if chosen is None:
            return self.outputs.get(self.workflow.order()[-1], "")
        if is_template(chosen):
            return render(chosen, self.input_text, self.outputs)
        return self.outputs.get(chosen, "")


async def run_workflow(workflow: Workflow, input_text: str, run_step: RunStep, *, deadline: float) -> WorkflowResult:
    """Run ``workflow`` on ``input_text`` until done, a step fails for good, or ``deadline`` (trio time)."""
    run = _Run(workflow, input_text, run_step, deadline)
    # Each step is a child intent bounded by ``deadline`` already; the grace lets it record its own end.
    with trio.move_on_at(deadline + _GRACE_S) as timer:
        async with trio.open_nursery() as nursery:
            for step in workflow.steps:
                nursery.start_soon(run.step, step, nursery.cancel_scope)
    for state in run.states.values():
        if state.status in ("pending", "running"):
            state.status = "cancelled"
    if run.failed is not None and run.failed[1].outcome == "timeout" and trio.current_time() >= deadline:
        step_id = run.failed[0]
        return WorkflowResult("timeout", None, f"the workflow did not finish within its time (step {step_id!r} was cut off)",
                              step_id, run.states)
    if run.failed is not None:
        step_id, result = run.failed
        state = run.states[step_id]
        agent = workflow_step(workflow, step_id).agent_ref
        error = (f"step {step_id!r} ({agent}) failed with outcome {result.outcome} after {state.attempts} "
                 f"attempt{'s' if state.attempts != 1 else ''}: {result.error or 'no detail'}")
        return WorkflowResult("step_failed", None, error, step_id, run.states)
    if timer.cancelled_caught:
        running = [s for s, st in run.states.items() if st.status == "cancelled"]
        error = f"the workflow did not finish within its time (steps not done: {', '.join(running) or 'none'})"
        return WorkflowResult("timeout", None, error, None, run.states)
    return WorkflowResult("ok", run.output(), None, None, run.states)


def workflow_step(workflow: Workflow, step_id: str) -> WorkflowStep:
    return next(step for step in workflow.steps if step.id == step_id)
