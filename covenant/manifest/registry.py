"""The registry: every agent found in an agents folder, and every problem, separately.

Layout scanned (non-recursive beyond one package level; names starting with
``.`` are ignored)::

    agents_dir/*.toml              one agent.toml-format manifest per file
    agents_dir/<dir>/agent.toml    a package folder (entry relative to <dir>)
    agents_dir/<dir>/Runefile      a Rune package

One bad file never hides the others: each manifest is loaded on its own and
its problems are collected. Two manifests declaring the same agent id are
*both* rejected (neither wins silently), each problem naming the other file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from covenant.manifest.agent_toml import key_line, load_agent_toml, normalize_agent_id
from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import ManifestError, Problem
from covenant.manifest.security import escape_problem, ownership_problems

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage

__all__ = ["Registry", "scan_agents", "load_path", "check_paths", "AGENT_TOML", "RUNEFILE"]

AGENT_TOML = "agent.toml"
RUNEFILE = "Runefile"


@dataclass(frozen=True)
class Registry:
    """Valid agents by id, every problem, and what became of every manifest file found."""

    agents: dict[str, AgentSpec] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    sources: dict[Path, str | None] = field(default_factory=dict)
    """Every manifest file found -> the agent id it defines, or None when it was rejected."""
    rune_packages: dict[str, RunePackage] = field(default_factory=dict)
    """Agent id -> the RunePackage behind a ``runtime = "rune"`` agent."""

    def get(self, agent_id: str) -> AgentSpec | None:
        """The agent with this id; a bare ``name`` is looked up as ``name@local``."""
        return self.agents.get(normalize_agent_id(agent_id)[0])


@dataclass
class _Loaded:
    path: Path
    spec: AgentSpec
    package: RunePackage | None


def _load_one(manifest: Path, real_root: str | None) -> _Loaded:
    """Load one manifest with its security checks; raises ManifestError with every problem."""
    problems: list[Problem] = []
    if real_root is not None:
        for candidate in (manifest.parent, manifest):
            escaped = escape_problem(candidate, real_root, report_as=manifest)
            if escaped is not None:
                raise ManifestError([escaped])
    problems.extend(ownership_problems(manifest, "the manifest"))
    if real_root is not None and os.path.realpath(manifest.parent) != real_root:
        problems.extend(ownership_problems(manifest.parent, "the package folder"))
    package = None
    try:
        if manifest.name == RUNEFILE:
            from covenant.manifest.runefile import load_rune_package  # yaml and pydantic models only when needed

            package = load_rune_package(manifest.parent)
            spec = package.to_agent_spec()
            for path in package.files[1:]:
                problems.extend(ownership_problems(path, "the package file"))
        else:
            spec = load_agent_toml(manifest)
            if spec.entry is not None:
                problems.extend(ownership_problems(spec.entry, "the entry"))
    except ManifestError as exc:
        problems.extend(exc.problems)
    if problems:
        raise ManifestError(problems)
    return _Loaded(manifest, spec, package)


def _id_line(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if path.name == RUNEFILE:
        from covenant.manifest._yamlio import node_line

        return node_line(text, ("name",))
    return key_line(text, "agent", "id")


def _assemble(manifests: list[tuple[Path, str | None]], problems: list[Problem]) -> Registry:
    """Load every manifest, then reject every id declared by more than one file."""
    sources: dict[Path, str | None] = {}
    loaded: list[_Loaded] = []
    for manifest, real_root in manifests:
        sources[manifest] = None
        try:
            loaded.append(_load_one(manifest, real_root))
        except ManifestError as exc:
            problems.extend(exc.problems)
    by_id: dict[str, list[_Loaded]] = {}
    for item in loaded:
        by_id.setdefault(item.spec.id, []).append(item)
    agents: dict[str, AgentSpec] = {}
    packages: dict[str, RunePackage] = {}
    for agent_id, items in by_id.items():
        if len(items) > 1:
            for item in items:
                others = ", ".join(str(o.path) for o in items if o is not item)
                problems.append(
                    Problem(
                        item.path,
                        _id_line(item.path),
                        "agent.id" if item.path.name != RUNEFILE else "name",
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
    problems.sort(key=lambda p: (str(p.path), p.line or 0))
    return Registry(agents=agents, problems=problems, sources=sources, rune_packages=packages)


def _manifests_in(folder: Path) -> list[Path]:
    """The manifest files of an agents folder, in name order."""
    found: list[Path] = []
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            path = folder / entry.name
            if entry.is_dir():
                for name in (AGENT_TOML, RUNEFILE):
                    if os.path.lexists(path / name):
                        found.append(path / name)
            elif entry.name.endswith(".toml"):
                found.append(path)
    return found


def _folder_problems(folder: Path) -> list[Problem]:
    return ownership_problems(folder, "the agents folder")


def scan_agents(agents_dir: Path) -> Registry:
    """Scan ``agents_dir``: valid agents, every problem, and the fate of every manifest file.

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
    return _assemble([(m, real_root) for m in _manifests_in(agents_dir)], [])


def _package_manifests(folder: Path) -> list[Path]:
    return [folder / name for name in (AGENT_TOML, RUNEFILE) if os.path.lexists(folder / name)]


def check_paths(paths: list[Path]) -> Registry:
    """``covenant agents check PATH…``: each PATH is a manifest, a package folder or an agents folder.

    Files and package folders named explicitly are not held to the
    symlink-containment rule (there is no agents folder to stay inside);
    ownership and mode checks apply to all. Duplicate ids are detected across
    every PATH together.
    """
    manifests: list[tuple[Path, str | None]] = []
    problems: list[Problem] = []
    for raw in paths:
        path = Path(os.path.abspath(raw))
        if not os.path.lexists(path):
            problems.append(Problem(path, None, None, "does not exist"))
        elif path.is_dir() and _package_manifests(path):
            manifests.extend((m, None) for m in _package_manifests(path))
        elif path.is_dir():
            folder_problems = _folder_problems(path)
            if folder_problems:
                problems.extend(folder_problems)
                continue
            real_root = os.path.realpath(path)
            manifests.extend((m, real_root) for m in _manifests_in(path))
        else:
            manifests.append((path, None))
    return _assemble(manifests, problems)


def load_path(path: Path) -> AgentSpec:
    """One agent from a ``*.toml`` file, a folder with ``agent.toml``, or a folder with a ``Runefile``.

    Used by ``covenant run PATH``; the same ownership checks as the registry
    apply (fail closed). For a Rune package, ``load_rune_package(spec.root)``
    gives the package itself. Raises ManifestError.
    """
    path = Path(os.path.abspath(path))
    if path.is_dir():
        candidates = _package_manifests(path)
        if not candidates:
            raise ManifestError(
                [Problem(path, None, None, f"holds neither {AGENT_TOML} nor {RUNEFILE}: not an agent package")]
            )
        path = candidates[0]
    elif not os.path.lexists(path):
        raise ManifestError([Problem(path, None, None, "io error: does not exist")])
    return _load_one(path, None).spec
