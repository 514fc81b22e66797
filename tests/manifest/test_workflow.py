"""workflow.yaml: the spec's rules, the topological order and the cycle message."""

from __future__ import annotations

from pathlib import Path

import pytest

from covenant.manifest.problems import ManifestError, Problem
from covenant.manifest.runefile import load_rune_package
from covenant.manifest.workflow import Workflow, parse_condition, topological_order
from tests.manifest.helpers import VALID_WORKFLOW, write_rune


def _workflow_problems(tmp_path: Path, text: str) -> list[Problem]:
    with pytest.raises(ManifestError) as info:
        load_rune_package(write_rune(tmp_path, workflow=text))
    return [p for p in info.value.problems if p.path.name == "workflow.yaml"]


def _wf(*steps: tuple[str, list[str]]) -> Workflow:
    return Workflow.model_validate(
        {
            "name": "w",
            "version": "1",
            "steps": [{"id": i, "agent_ref": "local://x", "depends_on": deps} for i, deps in steps],
        }
    )


def test_valid_workflow_and_defaults(tmp_path: Path) -> None:
    package = load_rune_package(write_rune(tmp_path, workflow=VALID_WORKFLOW))
    wf = package.workflow
    assert wf is not None and package.workflow_path == tmp_path / "workflow.yaml"
    assert wf.description == "" and wf.timeout_ms == 120000 and wf.output_step is None
    step = wf.steps[0]
    assert step.input_template == "{{ input }}" and step.depends_on == () and step.condition is None
    assert step.timeout_ms is None


def test_spec_example_with_conditions_is_valid(tmp_path: Path) -> None:
    text = """\
name: triage-pipeline
version: 0.1.0
description: Route and handle support tickets
timeout_ms: 120000
steps:
  - id: router
    agent_ref: local://router
    input_template: "{{ input }}"
  - id: technical
    agent_ref: local://technical-support
    input_template: "{{ steps.router.output }}"
    depends_on: [router]
    condition: "{{ steps.router.output }} == technical"
  - id: billing
    agent_ref: https://billing.example/a2a
    input_template: "{{ steps.router.output }}"
    depends_on: [router]
    condition: "{{ steps.router.output }} == \\"billing\\""
output_step: "{{ steps.technical.output }}"
"""
    wf = load_rune_package(write_rune(tmp_path, workflow=text)).workflow
    assert wf is not None and wf.order() == ("router", "technical", "billing")
    assert parse_condition(wf.steps[2].condition or "") is not None
    assert parse_condition(wf.steps[2].condition or "").value == "billing"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("name: w\nversion: '1'\nsteps: []\n", "steps", "at least one step"),
        ("name: w\nversion: '1'\n", "steps", "required field is missing"),
        ("name: w\nversion: '1'\nsteps:\n  - id: ''\n    agent_ref: local://x\n", "steps[0].id", "must not be empty"),
        (
            "name: w\nversion: '1'\nsteps:\n  - id: a\n    agent_ref: local://x\n  - id: a\n    agent_ref: local://x\n",
            "steps[1].id",
            "duplicate step id 'a'",
        ),
        (
            "name: w\nversion: '1'\nsteps:\n  - id: a\n    agent_ref: local://x\n    depends_on: [ghost]\n",
            "steps[0].depends_on[0]",
            "unknown step 'ghost'",
        ),
        (
            "name: w\nversion: '1'\nsteps:\n  - id: a\n    agent_ref: local://x\n    depends_on: [a]\n",
            "steps[0].depends_on[0]",
            "depends on itself",
        ),
        ("name: w\nversion: '1'\nsteps:\n  - id: a\n    agent_ref: router\n", "steps[0].agent_ref", "local://agent-name"),
        (
            "name: w\nversion: '1'\nsteps:\n  - id: a\n    agent_ref: local://x\n    condition: maybe\n",
            "steps[0].condition",
            "expected `{{ steps.<id>.output }} == value` (or != value, contains value)",
        ),
        (
            "name: w\nversion: '1'\nsteps:\n  - id: a\n    agent_ref: local://x\n  - id: b\n    agent_ref: local://x\n"
            "    input_template: '{{ steps.a.output }}'\n",
            "steps[1].input_template",
            "does not depend on 'a'",
        ),
        (
            "name: w\nversion: '1'\nsteps:\n  - id: a\n    agent_ref: local://x\noutput_step: '{{ steps.z.output }}'\n",
            "output_step",
            "unknown step 'z'",
        ),
        ("name: w\nversion: '1'\nsteps:\n  - id: a\n    agent_ref: local://x\n    timeout_ms: 0\n", "steps[0].timeout_ms", "greater than 0"),
        ("name: w\nversion: '1'\nsteps:\n  - id: a\n    agent_ref: local://x\n    needs: [b]\n", "steps[0].needs", "unknown key"),
        ("name: w\nversion: '1'\ntimeout_ms: -1\nsteps:\n  - id: a\n    agent_ref: local://x\n", "timeout_ms", "greater than 0"),
        ("version: '1'\nsteps:\n  - id: a\n    agent_ref: local://x\n", "name", "required field is missing"),
    ],
)
def test_workflow_rule_violations(tmp_path: Path, text: str, field: str, fragment: str) -> None:
    problems = _workflow_problems(tmp_path, text)
    matching = [p for p in problems if p.field == field]
    assert matching, problems
    assert fragment in matching[0].message


def test_cycle_is_named_with_its_steps_and_line(tmp_path: Path) -> None:
    text = (
        "name: w\nversion: '1'\nsteps:\n"
        "  - id: start\n    agent_ref: local://x\n"
        "  - id: a\n    agent_ref: local://x\n    depends_on: [start, c]\n"
        "  - id: b\n    agent_ref: local://x\n    depends_on: [a]\n"
        "  - id: c\n    agent_ref: local://x\n    depends_on: [b]\n"
    )
    (problem,) = _workflow_problems(tmp_path, text)
    assert "dependency cycle a -> c -> b -> a" in problem.message
    assert problem.field == "steps[1].depends_on" and problem.line == 8


def test_topological_order_is_stable_and_respects_dependencies() -> None:
    order, cycle = topological_order(_wf(("c", ["b"]), ("a", []), ("b", ["a"]), ("d", [])).steps)
    assert cycle is None and order == ["a", "b", "d", "c"]


def test_topological_order_reports_a_two_step_cycle() -> None:
    order, cycle = topological_order(_wf(("a", ["b"]), ("b", ["a"]), ("c", [])).steps)
    assert order == ["c"] and cycle == ["a", "b", "a"]


def test_parse_condition_forms() -> None:
    cond = parse_condition("{{ steps.router.output }} != 'billing'")
    assert cond is not None and (cond.step, cond.op, cond.value) == ("router", "!=", "billing")
    assert parse_condition("{{ steps.router.output }} ==") is None
    assert parse_condition("router == x") is None


def test_conditions_hold_by_their_operator() -> None:
    """`==`/`!=` compare the whole output; `contains` finds a word or phrase in a sentence, in any case."""
    sentence = "[stand-in model] classify_ticket says: Billing. Next step: hand it to the billing team."

    def holds(text: str, output: str) -> bool:
        cond = parse_condition(text)
        assert cond is not None, text
        return cond.holds(output)

    assert holds("{{ steps.c.output }} == billing", "  billing\n") and not holds("{{ steps.c.output }} == billing", sentence)
    assert holds("{{ steps.c.output }} != billing", sentence) and not holds("{{ steps.c.output }} != billing", "billing")
    assert holds("{{ steps.c.output }} contains billing", sentence)
    assert not holds("{{ steps.c.output }} contains technical", sentence)
    assert not holds("{{ steps.c.output }} contains bill", sentence)  # a whole word, not a part of one
    assert holds("{{ steps.c.output }} contains 'billing team'", sentence)
    assert not holds("{{ steps.c.output }} contains billing", "")  # a skipped step's empty output
    assert holds("{{ steps.c.output }} contains a.b", "see a.b here") and not holds("{{ steps.c.output }} contains a.b", "axb")
    for malformed in ("{{ steps.c.output }} contains", "{{ steps.c.output }} contains ''",
                      "{{ steps.c.output }} containsbilling", "{{ steps.c.output }} includes billing"):
        assert parse_condition(malformed) is None, malformed
