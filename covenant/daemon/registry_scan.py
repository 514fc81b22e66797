"""One scan of the agents folder as the daemon loads it: the registry, with snapshots behind it.

Every valid manifest's package is snapshotted (:mod:`covenant.manifest.snapshots`);
every rejected manifest that had a valid version runs from that version's
snapshot instead, until the file loads again. Each agent also gets a content
digest — its package's files and, for a Rune agent, its skills — so a reload
can tell an edited Runefile, tool file or skill from an untouched one.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from covenant.config import Config
from covenant.home import Home
from covenant.manifest.file_tree import TooDeep, files_under
from covenant.manifest.limits import ManifestLimits
from covenant.manifest.problems import ManifestError
from covenant.manifest.registry import Registry, load_manifest, scan_agents
from covenant.manifest.snapshots import SnapshotStore, TooLarge, package_files
from covenant.rune.skills import skill_folders
from covenant.tools.refuse import enforce_unavailable_policy

__all__ = ["Scan", "scan_with_snapshots", "snapshot_store"]

log = logging.getLogger("covenant.daemon")


@dataclass(frozen=True)
class Scan:
    """The registry the daemon loads, and what the snapshots added to it."""

    registry: Registry
    snapshots: dict[str, Path] = field(default_factory=dict)
    """Agent id -> the rejected manifest it waits on, for each agent running from its last valid version."""
    digests: dict[str, str] = field(default_factory=dict)
    """Agent id -> the digest of what it runs (package files and skills)."""


def _skills_digest(skills_root: Path, skills: tuple[str, ...], store: SnapshotStore) -> str:
    """The content of the skill folders a Runefile names (``owner/repo/skill``, each place the loader tries),
    missing ones included as such."""
    h = hashlib.sha256()
    for skill, folder in ((skill, folder) for skill in skills for folder in skill_folders(skill, skills_root)):
        h.update(f"skill {skill} {folder.relative_to(skills_root)}\n".encode("utf-8", "surrogateescape"))
        paths: list[Path] = []
        try:
            paths.extend(files_under(folder, skip_dot_names=False) if folder.is_dir() else ())
        except TooDeep as exc:  # the files found before the walk gave up still count (SKILL.md comes first)
            h.update(f"too deep: {exc}\n".encode("utf-8", "surrogateescape"))
        for path in sorted(paths):
            try:
                st = path.stat()
                if path.is_file():
                    h.update(f"{path.relative_to(folder)} {store.hashes.of(path, st)}\n".encode("utf-8", "surrogateescape"))
            except OSError:
                h.update(f"{path.relative_to(folder)} unreadable\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _digest(package_digest: str, registry: Registry, agent_id: str, skills_root: Path, store: SnapshotStore) -> str:
    package = registry.rune_packages.get(agent_id)
    if package is None or not package.runefile.skills:
        return package_digest
    skills = _skills_digest(skills_root, package.runefile.skills, store)
    return hashlib.sha256(f"{package_digest} {skills}".encode()).hexdigest()


def scan_with_snapshots(home: Home, config: Config, store: SnapshotStore) -> Scan:
    """Scan ``agents_dir`` as the daemon loads it (blocking: run it in a thread).

    The folder is ``config``'s (the daemon's running config, resolved against the home like
    :attr:`Home.agents_dir <covenant.home.Home.agents_dir>`), never covenant.toml read again: a
    changed ``agents_dir`` applies at the next start, and a broken file does not stop a rescan."""
    limits = ManifestLimits.from_config(config.runtime)
    agents_dir = home.root / config.agents_dir
    registry = enforce_unavailable_policy(scan_agents(agents_dir, limits), config)
    skills_root = home.root / config.rune.skills_dir  # an absolute skills_dir replaces the home part
    kept: dict[Path, str] = {}
    digests: dict[str, str] = {}
    for path, agent_id in registry.sources.items():
        if agent_id is None:
            continue
        try:
            files = package_files(path, agents_dir, registry.agents[agent_id].entry, store.hashes)
            digests[agent_id] = _digest(files.digest, registry, agent_id, skills_root, store)
            kept[path] = store.store(files, path, agent_id).digest
        except TooLarge as exc:
            log.warning("agent package not snapshotted: a broken edit will withdraw it",
                        extra={"agent": agent_id, "path": str(path), "reason": str(exc)})
        except OSError as exc:
            log.warning("agent package not snapshotted", extra={"agent": agent_id, "path": str(path),
                                                                "reason": str(exc)})
    snapshots: dict[str, Path] = {}
    for path, agent_id in registry.sources.items():
        if agent_id is not None:
            continue
        snapshot = store.find(path)
        if snapshot is None:
            continue
        try:
            loaded = load_manifest(snapshot.manifest, snapshot.files_root, limits)
        except ManifestError as exc:  # a snapshot is a copy of a valid version; damaged, it is dropped
            log.warning("agent snapshot unusable", extra={"path": str(path), "problem": str(exc)})
            continue
        agent_id = loaded.spec.id
        if agent_id in registry.agents or agent_id in snapshots:
            continue  # another file provides the id now: that one runs
        one = enforce_unavailable_policy(Registry(
            agents={agent_id: loaded.spec}, sources={snapshot.manifest: agent_id},
            rune_packages={agent_id: loaded.package} if loaded.package is not None else {},
            workflows={agent_id: loaded.workflow} if loaded.workflow is not None else {}), config)
        if agent_id not in one.agents:
            continue  # this host's [rune] unavailable_tools refuses the old version too
        registry.agents[agent_id] = loaded.spec
        if loaded.package is not None:
            registry.rune_packages[agent_id] = loaded.package
        if loaded.workflow is not None:
            registry.workflows[agent_id] = loaded.workflow
        snapshots[agent_id] = path
        digests[agent_id] = _digest(snapshot.digest, registry, agent_id, skills_root, store)
        kept[path] = snapshot.digest
    try:
        store.keep(kept)
    except OSError as exc:
        log.warning("snapshot index not written", extra={"reason": str(exc)})
    for agent_id, digest in digests.items():
        package = registry.rune_packages.get(agent_id)
        if package is not None:
            registry.rune_packages[agent_id] = replace(package, content_digest=digest)
    return Scan(registry, snapshots, digests)


def snapshot_store(home: Home) -> SnapshotStore:
    """The home's ``state/snapshots``."""
    return SnapshotStore(home.state_dir / "snapshots")

