"""``workflow.yaml``: a DAG of agent steps, validated as the Rune spec requires.

The rules (at least one step, unique non-empty ids, known ``depends_on``, no
self-dependency, acyclic) are checked by :func:`workflow_problems`, a pure
function returning ``(loc, message)`` pairs so the loader can attach lines.
The cycle is found with a topological sort and named step by step.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictStr, model_validator

from covenant.manifest.tools import AGENT_REF, NonEmptyStr, PositiveInt

__all__ = [
    "WORKFLOW_FILE",
    "Workflow",
    "WorkflowStep",
    "StepRetries",
    "Condition",
    "parse_condition",
    "step_references",
    "topological_order",
    "workflow_problems",
    "step_agent_warnings",
]

WORKFLOW_FILE = "workflow.yaml"

_STEP_REF = re.compile(r"\{\{\s*steps\.([^.\s{}]+)\.output\s*\}\}")
_CONDITION = re.compile(r"^\s*\{\{\s*steps\.([^.\s{}]+)\.output\s*\}\}\s*(==|!=|contains(?=\s))\s*(.*?)\s*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepRetries(_Model):
    """How often a failed step is tried again (docs/workflows.md).

    ``max_attempts`` in all; ``backoff`` as for tools (``exponential`` 200 ms doubling to 5 s,
    ``fixed`` 200 ms, ``none``); ``on`` the step outcomes worth another attempt (empty: every
    failure except a refusal).
    """

    max_attempts: Annotated[int, Strict(), Field(ge=1, le=10)] = 1
    backoff: Literal["exponential", "fixed", "none"] = "exponential"
    on: tuple[NonEmptyStr, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _yaml_on_key(cls, data: Any) -> Any:
        """YAML 1.1 reads a bare ``on:`` key as the boolean true; here it can only mean ``on``."""
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if key is True else key): value for key, value in data.items()}
        return data


class WorkflowStep(_Model):
    id: StrictStr
    agent_ref: NonEmptyStr
    input_template: StrictStr = "{{ input }}"
    depends_on: tuple[StrictStr, ...] = ()
    condition: StrictStr | None = None
    timeout_ms: PositiveInt | None = None
    retries: StepRetries = StepRetries()


class Workflow(_Model):
    name: NonEmptyStr
    version: NonEmptyStr
    description: StrictStr = ""
    timeout_ms: Annotated[int, Strict(), Field(gt=0, le=24 * 3600 * 1000)] = 120_000
    steps: tuple[WorkflowStep, ...]
    output_step: StrictStr | None = None

    def order(self) -> tuple[str, ...]:
        """Step ids in an order where every step comes after its dependencies (valid workflows only)."""
        return tuple(topological_order(self.steps)[0])


class Condition(_Model):
    """A parsed skip expression: ``{{ steps.<step>.output }} <op> value``.

    ``==`` and ``!=`` compare the whole output (surrounding whitespace removed); ``contains`` holds when the
    value appears in it as a whole word or phrase, in any case: a model's step answers in a sentence
    ("… says: billing. Next step …"), which no ``==`` could match.
    """

    step: str
    op: Literal["==", "!=", "contains"]
    value: str

    def holds(self, output: str) -> bool:
        if self.op == "contains":
            return re.search(rf"(?<!\w){re.escape(self.value)}(?!\w)", output, re.IGNORECASE) is not None
        equal = output.strip() == self.value
        return equal if self.op == "==" else not equal


def parse_condition(text: str) -> Condition | None:
    """Parse ``{{ steps.router.output }} == technical`` (``!=``, ``contains``; value may be quoted); None when malformed."""
    match = _CONDITION.match(text)
    if match is None or not match.group(3):
        return None
    value = match.group(3)
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    if match.group(2) == "contains" and not value.strip():
        return None  # every output contains nothing
    return Condition(step=match.group(1), op=match.group(2), value=value)  # type: ignore[arg-type]


def step_references(template: str) -> list[str]:
    """Step ids a template reads with ``{{ steps.<id>.output }}``."""
    return _STEP_REF.findall(template)


def topological_order(steps: tuple[WorkflowStep, ...]) -> tuple[list[str], list[str] | None]:
    """``(order, cycle)``: Kahn's sort in declaration order; ``cycle`` names one loop, or None.

    Self-edges and references to unknown steps are ignored here (reported separately).
    """
    ids = {step.id for step in steps}
    deps = {step.id: [d for d in dict.fromkeys(step.depends_on) if d in ids and d != step.id] for step in steps}
    done: set[str] = set()
    order: list[str] = []
    pending = [step.id for step in steps]
    progress = True
    while pending and progress:
        progress = False
        for step_id in list(pending):
            if all(d in done for d in deps[step_id]):
                order.append(step_id)
                done.add(step_id)
                pending.remove(step_id)
                progress = True
    if not pending:
        return order, None
    # Every pending step waits on another pending step: follow those edges until one repeats.
    path: list[str] = [pending[0]]
    while True:
        nxt = next(d for d in deps[path[-1]] if d not in done)
        if nxt in path:
            return order, path[path.index(nxt) :] + [nxt]
        path.append(nxt)


def workflow_problems(workflow: Workflow) -> list[tuple[tuple[str | int, ...], str]]:
    """Every rule of the spec that ``workflow`` breaks, as ``(loc, message)``."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    if not workflow.steps:
        return [(("steps",), "validation error: at least one step is required")]
    seen: dict[str, int] = {}
    for index, step in enumerate(workflow.steps):
        if not step.id.strip():
            problems.append((("steps", index, "id"), "validation error: step id must not be empty"))
        elif step.id in seen:
            problems.append(
                (("steps", index, "id"), f"validation error: duplicate step id {step.id!r} (also steps[{seen[step.id]}])")
            )
        else:
            seen[step.id] = index
    ids = set(seen)
    by_id = {step.id: step for step in workflow.steps}
    for index, step in enumerate(workflow.steps):
        if not AGENT_REF.match(step.agent_ref):
            problems.append(
                (("steps", index, "agent_ref"), f"validation error: {step.agent_ref!r} must be local://agent-name or an http(s) URL")
            )
        for dep_index, dep in enumerate(step.depends_on):
            if dep == step.id:
                problems.append(
                    (("steps", index, "depends_on", dep_index), f"validation error: step {step.id!r} depends on itself")
                )
            elif dep not in ids:
                problems.append(
                    (("steps", index, "depends_on", dep_index), f"validation error: unknown step {dep!r} in depends_on")
                )
        if step.condition is not None and parse_condition(step.condition) is None:
            problems.append(
                (
                    ("steps", index, "condition"),
                    "validation error: expected `{{ steps.<id>.output }} == value` (or != value, contains value), got " + repr(step.condition),
                )
            )
    _, cycle = topological_order(workflow.steps)
    if cycle is not None:
        index = next(i for i, s in enumerate(workflow.steps) if s.id == cycle[0])
        problems.append(
            (("steps", index, "depends_on"), "validation error: dependency cycle " + " -> ".join(cycle) + " (each step depends on the next)")
        )
        return problems
    # Templates may only read outputs of steps that are guaranteed to have run before.
    for index, step in enumerate(workflow.steps):
        ancestors = _ancestors(step.id, by_id)
        for key in ("input_template", "condition"):
            for ref in step_references(getattr(step, key) or ""):
                if ref not in ids:
                    problems.append((("steps", index, key), f"validation error: template reads unknown step {ref!r}"))
                elif ref not in ancestors:
                    problems.append(
                        ((("steps", index, key)), f"validation error: reads steps.{ref}.output but does not depend on {ref!r}; add it to depends_on")
                    )
    for ref in step_references(workflow.output_step or ""):
        if ref not in ids:
            problems.append((("output_step",), f"validation error: template reads unknown step {ref!r}"))
    return problems


def _ancestors(step_id: str, by_id: dict[str, WorkflowStep]) -> set[str]:
    found: set[str] = set()
    stack = list(by_id[step_id].depends_on) if step_id in by_id else []
    while stack:
        dep = stack.pop()
        if dep in found or dep not in by_id:
            continue
        found.add(dep)
        stack.extend(by_id[dep].depends_on)
    return found


def step_agent_warnings(workflow: Workflow, known: Callable[[str], bool]) -> list[str]:
    """Warnings (not problems) for steps whose local agent is not loaded now.

    An unknown agent may appear later (another folder, a reload); until then a
    dispatch fails at that step (outcome ``no_agent``).
    """
    out: list[str] = []
    for step in workflow.steps:
        if not step.agent_ref.startswith("local://"):
            continue  # a remote agent: decided when it runs ([a2a] remotes, the agent.remote grant)
        name = step.agent_ref.removeprefix("local://")
        if not known(name):
            out.append(f"workflow {workflow.name}: step {step.id!r}: no agent {name!r} is loaded "
                       "(the step fails with no_agent until one appears)")
    return out
