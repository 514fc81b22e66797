"""The workflow check's pure parts: the walk over every step (nested workflows once each) and the refusal."""

from __future__ import annotations

from covenant.client import EXIT_BY_CODE
from covenant.errors import ExitCode
from covenant.manifest.workflow import Workflow, WorkflowStep
from covenant.workflow.plan import workflow_plan
from covenant.workflow.preflight import StepVerdict, WorkflowDenied, WorkflowUnroutable, check_workflow, workflow_refusal


def _workflow(name: str, *steps: dict) -> Workflow:
    return Workflow.model_validate({"name": name, "version": "0.1.0", "steps": list(steps)})


OUTER = _workflow(
    "outer",
    {"id": "a", "agent_ref": "local://plain"},
    {"id": "b", "agent_ref": "local://inner", "depends_on": ["a"]},
    {"id": "c", "agent_ref": "local://outer", "depends_on": ["a"], "condition": "{{ steps.a.output }} == x"},
)
INNER = _workflow("inner", {"id": "x", "agent_ref": "local://locked"}, {"id": "y", "agent_ref": "local://outer"})
RUNS = {"inner@local": INNER, "outer@local": OUTER}


def _judge(step: WorkflowStep, caller: str, depth: int) -> tuple[StepVerdict, Workflow | None]:
    """Every agent is ``NAME@local``; ``locked`` needs a grant the issuer lacks; ``ghost`` is not loaded."""
    name = step.agent_ref.removeprefix("local://")
    if name == "ghost":
        return StepVerdict(step.id, step.agent_ref, False, reason="no_agent", message="no agent 'ghost' is loaded"), None
    agent = f"{name}@local"
    if name == "locked":
        return StepVerdict(step.id, step.agent_ref, False, agent=agent, routed_by="explicit", reason="capability_denied",
                           message="no", required=("tool.lock",), missing=("tool.lock",),
                           hint="covenant grant ana@box tool.lock"), None
    return StepVerdict(step.id, step.agent_ref, True, agent=agent, routed_by=f"depth {depth}"), RUNS.get(agent)


def test_every_step_is_judged_branches_and_nested_workflows_too_each_workflow_once() -> None:
    verdicts = check_workflow(OUTER, "outer@local", _judge, depth=0)
    assert [(v.label(), v.workflow, v.allowed, v.conditional) for v in verdicts] == [
        ("a", "outer", True, False),
        ("b", "outer", True, False),
        ("b > x", "inner", False, False),  # the step's own workflow, right after the step that runs it
        ("b > y", "inner", True, False),  # back to outer: expanded already, so the walk ends (a cycle)
        ("c", "outer", True, True),  # behind a condition: judged all the same
    ]
    assert [v.routed_by for v in verdicts if v.allowed] == ["depth 1", "depth 1", "depth 2", "depth 1"]


def test_a_policy_refusal_is_workflow_denied_naming_every_step_with_one_grant_command() -> None:
    ghost = _workflow("g", {"id": "a", "agent_ref": "local://ghost"}, {"id": "b", "agent_ref": "local://locked"},
                      {"id": "c", "agent_ref": "local://plain"})
    verdicts = check_workflow(ghost, "g@local", _judge, depth=0)
    refusal = workflow_refusal("g@local", verdicts, "ana@box")
    assert isinstance(refusal, WorkflowDenied) and refusal.code == "workflow_denied" and refusal.http_status == 403
    assert refusal.exit_code == EXIT_BY_CODE["workflow_denied"] == ExitCode.DENIED
    assert refusal.message.splitlines()[:4] == [
        "issuer ana@box may not run workflow g@local: 2 of its 3 steps may not run",
        "  step 'a' (local://ghost): no_agent: no agent 'ghost' is loaded",
        "  step 'b' (locked@local): missing tool.lock",
        "an operator can allow the missing actions with: covenant grant ana@box tool.lock",
    ]
    assert [s["step"] for s in refusal.details["steps"]] == ["a", "b"] and refusal.details["missing"] == ["tool.lock"]


def test_steps_without_an_agent_alone_are_no_agent_and_an_allowed_workflow_has_no_refusal() -> None:
    ghost = _workflow("g", {"id": "a", "agent_ref": "local://plain"},
                      {"id": "b", "agent_ref": "local://ghost", "condition": "{{ steps.a.output }} == never"})
    refusal = workflow_refusal("g@local", check_workflow(ghost, "g@local", _judge, depth=0), "ana@box")
    assert isinstance(refusal, WorkflowUnroutable) and refusal.code == "no_agent" and refusal.http_status == 404
    assert refusal.exit_code == ExitCode.NO_AGENT and refusal.details["hint"] is None
    assert "step 'b' (local://ghost, behind a condition): no_agent" in refusal.message
    fine = _workflow("f", {"id": "a", "agent_ref": "local://plain"})
    assert workflow_refusal("f@local", check_workflow(fine, "f@local", _judge, depth=0), "ana@box") is None


def test_the_plan_shows_each_wave_entry_with_its_decision_and_the_nested_steps_under_it() -> None:
    verdicts = check_workflow(OUTER, "outer@local", _judge, depth=0)
    plan = workflow_plan(OUTER, verdicts)
    (a,), (b, c) = plan["waves"]
    assert (a["step"], a["decision"], a["nested"]) == ("a", "allow", [])
    assert [(n["path"], n["decision"], n["missing"]) for n in b["nested"]] == [
        (["b", "x"], "deny", ["tool.lock"]), (["b", "y"], "allow", [])]
    assert c["conditional"] is True and c["condition"] == "{{ steps.a.output }} == x"
    assert plan["allowed"] is False and plan["denied"] == ["b > x"] and plan["capabilities"] == ["tool.lock"]
