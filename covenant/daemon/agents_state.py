"""The daemon's view of the registry across reloads.

A manifest that was valid and became invalid **withdraws** its agent until the
file is fixed: the daemon never keeps the old manifest while the package's code
files run as edited (a mix nobody wrote or reviewed), and a restart gives the
same answer as the reload did, because nothing depends on what was loaded
before. The withdrawn ids are reported (status, reload, audit) and a dispatch
naming one is told why it cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import Problem
from covenant.manifest.registry import Registry

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage
    from covenant.manifest.workflow import Workflow

__all__ = ["LoadedAgents", "ReloadChanges", "merge_reload"]


@dataclass(frozen=True)
class ReloadChanges:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    withdrawn: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, list[str]]:
        return {
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "withdrawn": self.withdrawn,
        }


@dataclass(frozen=True)
class LoadedAgents:
    """Agents the daemon dispatches to, and the problems of the last scan.

    ``withdrawn`` maps the id of an agent whose manifest was valid before the
    last reload and is rejected now to that manifest's path.
    """

    agents: dict[str, AgentSpec]
    problems: list[Problem]
    sources: dict[Path, str | None]
    withdrawn: dict[str, Path] = field(default_factory=dict)
    notes: tuple[Problem, ...] = ()
    """Info notes of the last scan (files ignored because they are not manifests)."""
    packages: dict[str, RunePackage] = field(default_factory=dict)
    """The Rune package behind each ``runtime = "rune"`` agent."""
    workflows: dict[str, Workflow] = field(default_factory=dict)
    """The DAG behind each ``runtime = "workflow"`` agent."""

    @classmethod
    def first(cls, registry: Registry) -> "LoadedAgents":
        return cls(dict(registry.agents), list(registry.problems), dict(registry.sources),
                   notes=tuple(registry.notes), packages=dict(registry.rune_packages),
                   workflows=_workflows(registry))


def _workflows(registry: Registry) -> dict[str, Workflow]:
    return {agent_id: folder.workflow for agent_id, folder in registry.workflows.items()}


def merge_reload(previous: LoadedAgents, fresh: Registry) -> tuple[LoadedAgents, ReloadChanges]:
    """What a fresh scan loads, and how it differs from what was loaded before.

    Only the fresh scan is loaded (see the module docstring); the previous state
    names the agents a rejected edit withdrew. A withdrawn agent stays withdrawn
    across further reloads while its file stays rejected.
    """
    agents = dict(fresh.agents)
    withdrawn = {
        agent_id: path for agent_id, path in previous.withdrawn.items()
        if fresh.sources.get(path, "gone") is None and agent_id not in agents
    }
    for path, old_id in previous.sources.items():
        if old_id is not None and fresh.sources.get(path, "gone") is None and old_id not in agents:
            withdrawn[old_id] = path  # was valid, now rejected, and no other file provides the id
    old_ids, new_ids = set(previous.agents), set(agents)
    changes = ReloadChanges(
        added=sorted(new_ids - old_ids),
        removed=sorted(old_ids - new_ids - set(withdrawn)),
        changed=sorted(i for i in old_ids & new_ids if agents[i] != previous.agents[i]),
        withdrawn=sorted(i for i in withdrawn if i in old_ids),
    )
    return (
        LoadedAgents(agents, list(fresh.problems), dict(fresh.sources), withdrawn, tuple(fresh.notes),
                     dict(fresh.rune_packages), _workflows(fresh)),
        changes,
    )
