"""Where the tool host finds an agent's Rune package (its toolset and tool descriptors)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import ManifestError
from covenant.manifest.runefile import RunePackage, load_rune_package

__all__ = ["PackageSource", "PackageFiles"]

log = logging.getLogger("covenant.tools")

PackageSource = Callable[[AgentSpec], RunePackage | None]
"""The package a Rune agent was loaded from, or None. The daemon passes its registry's
(``lambda agent: registry.rune_packages.get(agent.id)``), so tools always match what the
registry validated, ownership checks included."""


class PackageFiles:
    """A :data:`PackageSource` for hosts without a registry (``covenant run``, tests).

    Reads the package from ``agent.root`` once and again only when its
    Runefile changed (mtime and size); a package that no longer loads gives
    None (no tool is offered, every call is ``unknown_tool``).
    """

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[int, int, int], RunePackage | None]] = {}

    def __call__(self, agent: AgentSpec) -> RunePackage | None:
        if agent.runtime != "rune":
            return None
        try:
            st = os.stat(agent.manifest_path)
        except OSError:
            return None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._cache.get(agent.id)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            package: RunePackage | None = load_rune_package(agent.root)
        except ManifestError as exc:
            log.warning("rune package no longer loads", extra={"agent": agent.id, "detail": str(exc)})
            package = None
        self._cache[agent.id] = (stamp, package)
        return package
