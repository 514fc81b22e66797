"""The daemon's view of the registry across reloads.

A manifest that was valid and became invalid keeps its agent running from the
**snapshot** of its last valid package (:mod:`covenant.daemon.registry_scan`):
the old manifest with the old code, never the old manifest over edited code
(a mix nobody wrote or reviewed). Snapshots are kept under ``state/``, so a
restart gives the same answer as the reload did. An agent whose file is
rejected and that has no snapshot (it never loaded, or its package was too
large to copy) is **withdrawn** until the file is fixed. Both are reported
(status, reload, audit); a dispatch naming a withdrawn one is told why it
cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import Problem
from covenant.manifest.registry import Registry

if TYPE_CHECKING:
    from covenant.daemon.registry_scan import Scan
    from covenant.manifest.runefile import RunePackage
    from covenant.manifest.workflow import Workflow

__all__ = ["LoadedAgents", "ReloadChanges", "merge_reload"]


@dataclass(frozen=True)
class ReloadChanges:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    """Agents whose manifest, package files or skills differ from what ran before."""
    withdrawn: list[str] = field(default_factory=list)
    snapshot: list[str] = field(default_factory=list)
    """Agents now running from the snapshot of their last valid package (their file was rejected)."""

    def to_json(self) -> dict[str, list[str]]:
        return {
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "withdrawn": self.withdrawn,
            "snapshot": self.snapshot,
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
    snapshots: dict[str, Path] = field(default_factory=dict)
    """Agent id -> the rejected manifest it waits on, for each agent running from its last valid snapshot."""
    digests: dict[str, str] = field(default_factory=dict)
    """Agent id -> the digest of what it runs (package files and skills): a reload's ``changed``."""

    @property
    def rejected_files(self) -> int:
        """How many files were rejected: one however many problems it has (``covenant_registry_rejected_files``)."""
        return len({problem.path for problem in self.problems})

    @classmethod
    def first(cls, scan: Scan) -> "LoadedAgents":
        registry = scan.registry
        return cls(dict(registry.agents), list(registry.problems), dict(registry.sources),
                   notes=tuple(registry.notes), packages=dict(registry.rune_packages),
                   workflows=_workflows(registry), snapshots=dict(scan.snapshots), digests=dict(scan.digests))

    def state_of(self, agent_id: str) -> dict[str, str]:
        """``{"state": "loaded"}``, or ``snapshot`` with the file it waits on, for a loaded agent."""
        waiting = self.snapshots.get(agent_id)
        return {"state": "loaded"} if waiting is None else {"state": "snapshot", "waiting_on": str(waiting)}


def _workflows(registry: Registry) -> dict[str, Workflow]:
    return {agent_id: folder.workflow for agent_id, folder in registry.workflows.items()}


def _changed(agent_id: str, previous: LoadedAgents, agents: dict[str, AgentSpec], digests: dict[str, str]) -> bool:
    """Does the agent run something else now? By content when both versions have a digest (an agent that moved
    to its snapshot runs the same files from another folder: unchanged), else by the manifest's meaning."""
    before, now = previous.digests.get(agent_id), digests.get(agent_id)
    if before is not None and now is not None:
        return before != now
    return agents[agent_id] != previous.agents[agent_id]


def merge_reload(previous: LoadedAgents, scan: Scan) -> tuple[LoadedAgents, ReloadChanges]:
    """What a fresh scan loads, and how it differs from what was loaded before.

    Only the fresh scan (with its snapshots) is loaded (see the module docstring); the previous
    state names the agents a rejected edit withdrew. A withdrawn agent stays withdrawn across
    further reloads while its file stays rejected.
    """
    fresh = scan.registry
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
        changed=sorted(i for i in old_ids & new_ids if _changed(i, previous, agents, scan.digests)),
        withdrawn=sorted(i for i in withdrawn if i in old_ids),
        snapshot=sorted(i for i in scan.snapshots if i not in previous.snapshots),
    )
    return (
        LoadedAgents(agents, list(fresh.problems), dict(fresh.sources), withdrawn, tuple(fresh.notes),
                     dict(fresh.rune_packages), _workflows(fresh), dict(scan.snapshots), dict(scan.digests)),
        changes,
    )
