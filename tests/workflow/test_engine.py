"""The workflow engine's pure parts: templates, waves, load-time warnings; and the engine on stand-in steps."""

from __future__ import annotations

import trio

from covenant.manifest.workflow import Workflow, step_agent_warnings
from covenant.workflow.engine import StepResult, run_workflow
from covenant.workflow.plan import waves
from covenant.workflow.template import is_template, render


def _workflow(**data: object) -> Workflow:
    return Workflow.model_validate({"name": "w", "version": "1", **data})


def test_render_substitutes_once_and_evaluates_nothing() -> None:
    outputs = {"a": "{{ input }}", "b": "B"}
    assert render("{{input}}/{{ steps.a.output }}/{{ steps.b.output }}/{{ steps.zz.output }}", "I", outputs) == "I/{{ input }}/B/"
    assert render("{{ 1 + 1 }} {% for x in y %} {{ steps.b.output.__class__ }}", "I", outputs) == \
        "{{ 1 + 1 }} {% for x in y %} {{ steps.b.output.__class__ }}"
    assert is_template("{{ steps.x.output }}") and not is_template("analyst")


def test_waves_group_steps_by_dependency_depth() -> None:
    workflow = _workflow(steps=[
        {"id": "a", "agent_ref": "local://x"},
        {"id": "b", "agent_ref": "local://x"},
        {"id": "c", "agent_ref": "local://x", "depends_on": ["a"]},
        {"id": "d", "agent_ref": "local://x", "depends_on": ["c", "b"]},
    ])
    assert waves(workflow) == [["a", "b"], ["c"], ["d"]]


def test_unknown_step_agents_are_warnings_and_remote_ones_are_decided_when_they_run() -> None:
    workflow = _workflow(steps=[
        {"id": "a", "agent_ref": "local://known"},
        {"id": "b", "agent_ref": "local://ghost"},
        {"id": "c", "agent_ref": "https://far.example/a2a/x"},
    ])
    warnings = step_agent_warnings(workflow, lambda name: name == "known")
    assert len(warnings) == 1 and "'b'" in warnings[0] and "ghost" in warnings[0]


def test_a_failure_cancels_the_steps_still_running() -> None:
    workflow = _workflow(steps=[
        {"id": "slow", "agent_ref": "local://x"},
        {"id": "bad", "agent_ref": "local://x", "retries": {"max_attempts": 2, "backoff": "none"}},
        {"id": "after", "agent_ref": "local://x", "depends_on": ["slow"]},
    ])
    calls: list[str] = []

    async def run_step(step, text):  # type: ignore[no-untyped-def]
        calls.append(step.id)
        if step.id == "slow":
            await trio.sleep(3600)
        return StepResult("crashed", error="boom")

    async def main() -> None:
        result = await run_workflow(workflow, "in", run_step, deadline=trio.current_time() + 3600)
        assert result.outcome == "step_failed" and result.failed_step == "bad"
        assert "'bad'" in result.error and "2 attempts" in result.error and "boom" in result.error
        assert result.steps["slow"].status == "cancelled" and result.steps["after"].status == "cancelled"
        assert sorted(calls) == ["bad", "bad", "slow"]

    trio.run(main)


def test_refusals_are_not_retried() -> None:
    workflow = _workflow(steps=[{"id": "a", "agent_ref": "local://x", "retries": {"max_attempts": 5, "backoff": "none"}}])
    calls: list[str] = []

    async def run_step(step, text):  # type: ignore[no-untyped-def]
        calls.append(text)
        return StepResult("capability_denied", error="no grant")

    async def main() -> None:
        result = await run_workflow(workflow, "in", run_step, deadline=trio.current_time() + 60)
        assert result.outcome == "step_failed" and calls == ["in"]

    trio.run(main)
