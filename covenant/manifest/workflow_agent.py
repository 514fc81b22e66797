"""Workflow agents: a folder holding a ``workflow.yaml`` and no ``Runefile``.

Such a folder is an agent of its own, ``<workflow name>@local``, whose
steps call the Rune packages one level below it (``multi-agent/router/``,
...). The registry loads those packages too. The daemon runs the workflow
(:mod:`covenant.workflow.engine`); ``covenant run`` has no engine and ends
with the outcome ``workflow_not_supported`` (see :mod:`covenant.runtime.runner`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from covenant.manifest._yamlio import problem_at, read_yaml, validate_model
from covenant.manifest.limits import DEFAULT_LIMITS, ManifestLimits
from covenant.manifest.model import AgentSpec, Resources
from covenant.manifest.problems import ManifestError, Problem
from covenant.manifest.workflow import Workflow, workflow_problems

__all__ = ["WorkflowAgent", "load_workflow_agent"]

_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass(frozen=True)
class WorkflowAgent:
    """A validated workflow folder: the agent it registers and its DAG."""

    path: Path
    workflow: Workflow
    spec: AgentSpec


def load_workflow_agent(path: Path, limits: ManifestLimits = DEFAULT_LIMITS) -> WorkflowAgent:
    """Read ``path`` (a workflow.yaml) as a workflow agent; raises ManifestError with every problem."""
    path = Path(os.path.abspath(path))
    problems: list[Problem] = []
    loaded = read_yaml(path, problems, limits.max_bytes)
    if loaded is None:
        raise ManifestError(problems)
    text, data = loaded
    workflow = validate_model(Workflow, data, path, text, problems)
    if workflow is None:
        raise ManifestError(problems)
    problems.extend(problem_at(path, text, loc, message) for loc, message in workflow_problems(workflow))
    if not _NAME.match(workflow.name):
        problems.append(
            problem_at(
                path,
                text,
                ("name",),
                f"validation error: {workflow.name!r} names the workflow agent {workflow.name}@local: "
                "use lowercase letters, digits and single hyphens (e.g. research-and-analyse)",
            )
        )
    if problems:
        raise ManifestError(problems)
    spec = AgentSpec(
        id=f"{workflow.name}@local",
        name=workflow.name,
        version=workflow.version,
        runtime="workflow",
        kind="workflow.yaml",
        manifest_path=path,
        root=path.parent,
        entry=None,
        resources=Resources(cpu_ms_per_task=workflow.timeout_ms),
    )
    return WorkflowAgent(path, workflow, spec)
