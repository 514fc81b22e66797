"""The daemon's view of the registry across reloads.

A reload must never make things worse: a manifest that was valid and became
invalid keeps its previous version (and is reported), so a typo in an edit
does not take a working agent away.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import Problem
from typing import TYPE_CHECKING

from covenant.manifest.registry import Registry

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage

__all__ = ["LoadedAgents", "ReloadChanges", "merge_reload"]


@dataclass(frozen=True)
class ReloadChanges:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    kept_previous: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, list[str]]:
        return {
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "kept_previous": self.kept_previous,
        }


@dataclass(frozen=True)
class LoadedAgents:
    """Agents the daemon dispatches to, and the problems of the last scan."""

    agents: dict[str, AgentSpec]
    problems: list[Problem]
    sources: dict[Path, str | None]
    kept_previous: frozenset[str] = frozenset()
    notes: tuple[Problem, ...] = ()
    """Info notes of the last scan (files ignored because they are not manifests)."""
    packages: dict[str, RunePackage] = field(default_factory=dict)
    """The Rune package behind each ``runtime = "rune"`` agent."""

    @classmethod
    def first(cls, registry: Registry) -> "LoadedAgents":
        return cls(dict(registry.agents), list(registry.problems), dict(registry.sources),
                   notes=tuple(registry.notes), packages=dict(registry.rune_packages))


def merge_reload(previous: LoadedAgents, fresh: Registry) -> tuple[LoadedAgents, ReloadChanges]:
    """Combine a fresh scan with what was loaded before (see the module docstring)."""
    agents = dict(fresh.agents)
    sources = dict(fresh.sources)
    packages = dict(fresh.rune_packages)
    kept: list[str] = []
    for path, old_id in previous.sources.items():
        if old_id is None or fresh.sources.get(path, "gone") is not None:
            continue  # was rejected before, or is still valid, or the file is gone
        if old_id in agents:
            continue  # another valid file now provides this id
        agents[old_id] = previous.agents[old_id]
        sources[path] = old_id
        if old_id in previous.packages:
            packages[old_id] = previous.packages[old_id]
        kept.append(old_id)
    old_ids, new_ids = set(previous.agents), set(agents)
    changes = ReloadChanges(
        added=sorted(new_ids - old_ids),
        removed=sorted(old_ids - new_ids),
        changed=sorted(i for i in old_ids & new_ids if agents[i] != previous.agents[i]),
        kept_previous=sorted(kept),
    )
    return LoadedAgents(agents, list(fresh.problems), sources, frozenset(kept), tuple(fresh.notes), packages), changes
