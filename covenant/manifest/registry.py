"""The registry: every agent found in an agents folder, and every problem, separately.

Layout scanned (non-recursive beyond the package levels below; names
starting with ``.`` are ignored)::

    agents_dir/*.toml                    one agent.toml-format manifest per file
    agents_dir/<dir>/agent.toml          a package folder (entry relative to <dir>)
    agents_dir/<dir>/Runefile            a Rune package
    agents_dir/<dir>/workflow.yaml       with no Runefile: the workflow agent <workflow name>@local,
    agents_dir/<dir>/<pkg>/Runefile      and the Rune packages one level below it

Anything else (README, LICENSE, ``rune-compose.yml``, ``channels.yaml``, a
folder with no manifest, files beside a Runefile that are not part of the
package) is ignored with an info note (:attr:`Registry.notes`), never a
problem.

One bad file never hides the others: each manifest is loaded on its own and
its problems are collected. Two manifests declaring the same agent id are
*both* rejected (neither wins silently), each problem naming the other file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from covenant.manifest.agent_toml import load_agent_toml
from covenant.toml_lines import key_line
from covenant.manifest.limits import DEFAULT_LIMITS, ManifestLimits
from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import ManifestError, Problem
from covenant.manifest.security import escape_problem, is_inside, ownership_problems
from covenant.manifest.workflow import WORKFLOW_FILE, step_agent_warnings

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage
    from covenant.manifest.workflow_agent import WorkflowAgent

__all__ = ["Registry", "Loaded", "scan_agents", "load_path", "load_manifest", "check_paths", "AGENT_TOML", "RUNEFILE",
           "WORKFLOW_FILE"]

AGENT_TOML = "agent.toml"
RUNEFILE = "Runefile"
_RUNE_PARTS = frozenset({RUNEFILE, "tools", WORKFLOW_FILE})
"""Entries of a Rune package folder that the package loader reads."""


@dataclass(frozen=True)
class Registry:
    """Valid agents by id, every problem, and what became of every manifest file found."""

    agents: dict[str, AgentSpec] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    sources: dict[Path, str | None] = field(default_factory=dict)
    """Every manifest file found -> the agent id it defines, or None when it was rejected."""
    rune_packages: dict[str, RunePackage] = field(default_factory=dict)
    """Agent id -> the RunePackage behind a ``runtime = "rune"`` agent."""
    workflows: dict[str, WorkflowAgent] = field(default_factory=dict)
    """Agent id -> the workflow folder behind a ``runtime = "workflow"`` agent."""
    notes: list[Problem] = field(default_factory=list)
    """Info notes (files ignored because they are not manifests); never problems."""


@dataclass
class Loaded:
    """One valid manifest: its agent and, for a Rune package or a workflow folder, what stands behind it."""

    path: Path
    spec: AgentSpec
    package: RunePackage | None
    workflow: WorkflowAgent | None = None


def _package_folders(real_parent: str, real_root: str) -> list[Path]:
    """The real folders between the agents folder and a manifest (``multi-agent/router``, ``multi-agent``)."""
    folders: list[Path] = []
    folder = real_parent
    while folder != real_root and is_inside(folder, real_root):
        folders.append(Path(folder))
        folder = os.path.dirname(folder)
    return folders


def _load_one(manifest: Path, real_root: str | None, limits: ManifestLimits) -> Loaded:
    """Load one manifest with its security checks; raises ManifestError with every problem."""
    problems: list[Problem] = []
    if real_root is not None:
        for candidate in (manifest.parent, manifest):
            escaped = escape_problem(candidate, real_root, report_as=manifest)
            if escaped is not None:
                raise ManifestError([escaped])
    problems.extend(ownership_problems(manifest, "the manifest"))
    if real_root is not None:
        for folder in _package_folders(os.path.realpath(manifest.parent), real_root):
            problems.extend(ownership_problems(folder, "the package folder"))
    package = None
    workflow = None
    try:
        if manifest.name == RUNEFILE:
            from covenant.manifest.runefile import load_rune_package  # yaml and pydantic models only when needed

            package = load_rune_package(manifest.parent, limits)
            spec = package.to_agent_spec()
            for path in package.files[1:]:
                problems.extend(ownership_problems(path, "the package file"))
        elif manifest.name == WORKFLOW_FILE:
            from covenant.manifest.workflow_agent import load_workflow_agent

            workflow = load_workflow_agent(manifest, limits)
            spec = workflow.spec
        else:
            spec = load_agent_toml(manifest, limits)
            if spec.entry is not None:
                problems.extend(ownership_problems(spec.entry, "the entry"))
    except ManifestError as exc:
        problems.extend(exc.problems)
    if problems:
        raise ManifestError(problems)
    return Loaded(manifest, spec, package, workflow)


def _id_line(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if path.name in (RUNEFILE, WORKFLOW_FILE):
        from covenant.manifest._yamlio import node_line

        return node_line(text, ("name",))
    return key_line(text, "agent", "id")


def _warn_unknown_step_agents(
    agents: dict[str, AgentSpec], packages: dict[str, RunePackage], workflows: dict[str, WorkflowAgent]
) -> None:
    """Attach a warning to each workflow (folder or package) per step whose agent is not loaded."""
    names = {spec.name for spec in agents.values()}

    def known(name: str) -> bool:
        return name in agents or name in names

    for agent_id, spec in list(agents.items()):
        folder, package = workflows.get(agent_id), packages.get(agent_id)
        workflow = folder.workflow if folder is not None else package.workflow if package is not None else None
        if workflow is None:
            continue
        warnings = step_agent_warnings(workflow, known)
        if warnings:
            agents[agent_id] = spec.model_copy(update={"warnings": (*spec.warnings, *warnings)})
            if folder is not None:
                workflows[agent_id] = replace(folder, spec=agents[agent_id])


def _assemble(
    manifests: list[tuple[Path, str | None]],
    problems: list[Problem],
    notes: list[Problem],
    limits: ManifestLimits,
) -> Registry:
    """Load every manifest, then reject every id declared by more than one file."""
    sources: dict[Path, str | None] = {}
    loaded: list[Loaded] = []
    for manifest, real_root in manifests:
        sources[manifest] = None
        try:
            loaded.append(_load_one(manifest, real_root, limits))
        except ManifestError as exc:
            problems.extend(exc.problems)
    by_id: dict[str, list[Loaded]] = {}
    for item in loaded:
        by_id.setdefault(item.spec.id, []).append(item)
    agents: dict[str, AgentSpec] = {}
    packages: dict[str, RunePackage] = {}
    workflows: dict[str, WorkflowAgent] = {}
    for agent_id, items in by_id.items():
        if len(items) > 1:
            for item in items:
                others = ", ".join(str(o.path) for o in items if o is not item)
                problems.append(
                    Problem(
                        item.path,
                        _id_line(item.path),
                        "agent.id" if item.path.name not in (RUNEFILE, WORKFLOW_FILE) else "name",
                        f"duplicate agent id {agent_id!r}, also declared in {others}; "
                        "every file declaring it is rejected until the ids are unique",
                    )
                )
            continue
        item = items[0]
        agents[agent_id] = item.spec
        sources[item.path] = agent_id
        if item.package is not None:
            packages[agent_id] = item.package
        if item.workflow is not None:
            workflows[agent_id] = item.workflow
    problems.sort(key=lambda p: (str(p.path), p.line or 0))
    _warn_unknown_step_agents(agents, packages, workflows)
    return Registry(
        agents=agents,
        problems=problems,
        sources=sources,
        rune_packages=packages,
        workflows=workflows,
        notes=sorted(notes, key=lambda p: str(p.path)),
    )


def _note(path: Path, why: str) -> Problem:
    return Problem(path, None, None, f"info: ignored: {why}")


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    """The entries of ``folder`` in name order, without dot-names; none when it cannot be listed."""
    try:
        with os.scandir(folder) as entries:
            return sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError:
        return []


def _rune_extras(folder: Path, notes: list[Problem]) -> None:
    """Note the files beside a Runefile that are not part of the package (README, rune-compose.yml, ...)."""
    for entry in _entries(folder):
        if entry.name not in _RUNE_PARTS and not entry.is_dir():
            notes.append(_note(folder / entry.name, "not part of the Rune package (only Runefile, tools/ and workflow.yaml are read)"))


def _package_in(folder: Path, notes: list[Problem]) -> list[Path] | None:
    """The manifests of a package folder (agent.toml, Runefile, or a workflow folder); None when it is none."""
    found = [folder / name for name in (AGENT_TOML, RUNEFILE) if os.path.lexists(folder / name)]
    if found:
        if found[-1].name == RUNEFILE:
            _rune_extras(folder, notes)
        return found
    if not os.path.lexists(folder / WORKFLOW_FILE):
        return None
    found = [folder / WORKFLOW_FILE]
    for entry in _entries(folder):
        path = folder / entry.name
        if entry.name == WORKFLOW_FILE:
            continue
        if not entry.is_dir():
            notes.append(_note(path, "not a manifest (a workflow folder holds workflow.yaml and Rune package folders)"))
        elif os.path.lexists(path / RUNEFILE):
            found.append(path / RUNEFILE)
            _rune_extras(path, notes)
        else:
            notes.append(_note(path, f"a folder without a {RUNEFILE} inside a workflow folder"))
    return found


def _manifests_in(folder: Path, notes: list[Problem]) -> list[Path]:
    """The manifest files of an agents folder, in name order; what is not a manifest goes to ``notes``."""
    found: list[Path] = []
    for entry in _entries(folder):
        path = folder / entry.name
        if entry.is_dir():
            package = _package_in(path, notes)
            if package is None:
                notes.append(_note(path, f"a folder without {AGENT_TOML}, {RUNEFILE} or {WORKFLOW_FILE}"))
            else:
                found.extend(package)
        elif entry.name.endswith(".toml"):
            found.append(path)
        else:
            notes.append(_note(path, "not a manifest (manifests are *.toml files and package folders)"))
    return found


def _folder_problems(folder: Path) -> list[Problem]:
    return ownership_problems(folder, "the agents folder")


def scan_agents(agents_dir: Path, limits: ManifestLimits = DEFAULT_LIMITS) -> Registry:
    """Scan ``agents_dir``: valid agents, every problem, and the fate of every manifest file.

    ``limits`` bound every file read (``ManifestLimits.from_config(config.runtime)``).

    A missing folder is an empty registry with one problem. An agents folder
    writable by group or others is one problem and no agent is loaded from it.
    """
    agents_dir = Path(os.path.abspath(agents_dir))
    if not agents_dir.is_dir():
        return Registry(
            problems=[
                Problem(
                    agents_dir,
                    None,
                    None,
                    "the agents folder does not exist (create it, or set agents_dir in covenant.toml)",
                )
            ]
        )
    folder_problems = _folder_problems(agents_dir)
    if folder_problems:
        return Registry(problems=folder_problems)
    real_root = os.path.realpath(agents_dir)
    notes: list[Problem] = []
    manifests = _manifests_in(agents_dir, notes)
    return _assemble([(m, real_root) for m in manifests], [], notes, limits)


def check_paths(paths: list[Path], limits: ManifestLimits = DEFAULT_LIMITS) -> Registry:
    """``covenant agents check PATH…``: each PATH is a manifest, a package folder or an agents folder.

    Files and package folders named explicitly are not held to the
    symlink-containment rule (there is no agents folder to stay inside);
    ownership and mode checks apply to all. Duplicate ids are detected across
    every PATH together.
    """
    manifests: list[tuple[Path, str | None]] = []
    problems: list[Problem] = []
    notes: list[Problem] = []
    for raw in paths:
        path = Path(os.path.abspath(raw))
        package = _package_in(path, notes) if path.is_dir() else None
        if not os.path.lexists(path):
            problems.append(Problem(path, None, None, "does not exist"))
        elif package is not None:
            manifests.extend((m, None) for m in package)
        elif path.is_dir():
            folder_problems = _folder_problems(path)
            if folder_problems:
                problems.extend(folder_problems)
                continue
            real_root = os.path.realpath(path)
            manifests.extend((m, real_root) for m in _manifests_in(path, notes))
        else:
            manifests.append((path, None))
    return _assemble(manifests, problems, notes, limits)


def load_path(path: Path, limits: ManifestLimits = DEFAULT_LIMITS) -> AgentSpec:
    """One agent from a ``*.toml`` file, a folder with ``agent.toml``, a ``Runefile`` or a ``workflow.yaml``.

    Used by ``covenant run PATH``; the same ownership checks as the registry
    apply (fail closed). For a Rune package, ``load_rune_package(spec.root)``
    gives the package itself. Raises ManifestError.
    """
    path = Path(os.path.abspath(path))
    if path.is_dir():
        candidates = _package_in(path, [])
        if not candidates:
            raise ManifestError(
                [Problem(path, None, None, f"holds no {AGENT_TOML}, {RUNEFILE} or {WORKFLOW_FILE}: not an agent package")]
            )
        path = candidates[0]
    elif not os.path.lexists(path):
        raise ManifestError([Problem(path, None, None, "io error: does not exist")])
    return _load_one(path, None, limits).spec


def load_manifest(manifest: Path, package_root: Path, limits: ManifestLimits = DEFAULT_LIMITS) -> Loaded:
    """One manifest held to the agents folder's rules with ``package_root`` as that folder (a snapshot's
    ``files/``, :mod:`covenant.manifest.snapshots`). Raises ManifestError with every problem."""
    return _load_one(manifest, os.path.realpath(package_root), limits)
