"""Agents made at run time by ``rune@agent-spawn``: held by the daemon, never written to agents/.

A spawned agent is a Rune package built from the Runefile text an agent sent.
Its files live under ``<home>/state/spawned/<name>/`` (readable by the agent
uids, written only by the daemon), its id is ``<name>@spawned``, and it is
gone at ``rune@agent-kill``, at ``[rune] spawned_ttl_s`` and at daemon stop
(it never survives a restart: the folder is emptied at start). What it may do
is bounded by its spawner: every toolset entry must be one of the spawner's,
it gets no tools or MCP servers of its own, and it shares the spawner's
networks; calls to it are child intents, so the spawner's issuer's grants
decide them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import trio

from covenant.errors import CovenantError, ExitCode
from covenant.manifest.limits import ManifestLimits
from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import ManifestError
from covenant.manifest.runefile import RunePackage, load_rune_package

__all__ = ["Spawned", "SpawnedAgents", "SpawnRefused"]

MAX_MANIFEST_BYTES = 64 * 1024


class SpawnRefused(CovenantError):
    """``agent-spawn`` or ``agent-kill`` refused; the message says why."""

    code = "spawn_refused"
    exit_code = ExitCode.DENIED
    http_status = 403


@dataclass(frozen=True)
class Spawned:
    agent: AgentSpec
    package: RunePackage
    spawner: str
    """The agent id that spawned it."""
    issuer: str
    """The hex public key of the issuer it runs for (the spawning intent's root issuer)."""
    issuer_display: str
    created_ms: int
    expires_ms: int

    def view(self) -> dict[str, Any]:
        return {"agent": self.agent.id, "spawner": self.spawner, "issuer": self.issuer_display,
                "created_ms": self.created_ms, "expires_ms": self.expires_ms}


class SpawnedAgents:
    """The live spawned agents; every method that touches files blocks (call it off the event loop)."""

    def __init__(self, root: Path, limits: ManifestLimits, *, ttl_s: int, per_spawner: int) -> None:
        self.root = root
        self.limits = limits
        self.ttl_ms = ttl_s * 1000
        self.per_spawner = per_spawner
        self.live: dict[str, Spawned] = {}
        """Read and written on the event loop only; the file work runs in worker threads."""
        self._lock = trio.Lock()
        """One spawn or removal at a time: two of them never build into, or delete, the same folder."""

    def clear(self) -> None:
        """At start: whatever an earlier run left is removed (spawned agents never survive a restart)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)

    async def create(self, text: str, *, spawner: AgentSpec, spawner_package: RunePackage, issuer: str,
                     issuer_display: str, now_ms: int) -> Spawned:
        """A live ``<name>@spawned`` agent from Runefile ``text``; SpawnRefused naming what is wrong."""
        async with self._lock:
            if self.per_spawner == 0:
                raise SpawnRefused("spawning agents is off on this host ([rune] spawned_max = 0)")
            mine = sum(1 for s in self.live.values() if s.spawner == spawner.id and s.issuer == issuer)
            if mine >= self.per_spawner:
                raise SpawnRefused(f"{spawner.id} already holds {mine} spawned agents ([rune] spawned_max = "
                                   f"{self.per_spawner}); kill one first")
            if len(text.encode()) > MAX_MANIFEST_BYTES:
                raise SpawnRefused(f"the manifest is larger than {MAX_MANIFEST_BYTES // 1024} KiB")
            taken = frozenset(s.package.runefile.name for s in self.live.values())
            package = await trio.to_thread.run_sync(self._build, text, spawner_package, taken)
            spawned = Spawned(package.to_agent_spec(), package, spawner.id, issuer, issuer_display, now_ms,
                              now_ms + self.ttl_ms)
            self.live[spawned.agent.id] = spawned
            return spawned

    def _build(self, text: str, spawner_package: RunePackage, taken: frozenset[str]) -> RunePackage:
        """Validate the Runefile in a fresh folder, then move it to ``<root>/<name>`` (blocking)."""
        folder = Path(tempfile.mkdtemp(prefix=".new-", dir=self.root))
        try:
            os.chmod(folder, 0o755)  # the agent's uid reads its Runefile from here
            runefile_path = folder / "Runefile"
            runefile_path.write_text(text, encoding="utf-8")
            os.chmod(runefile_path, 0o644)
            try:
                package = load_rune_package(folder, self.limits)
            except ManifestError as exc:
                raise SpawnRefused("the manifest is not a valid Runefile: " + "; ".join(
                    str(p).replace(str(runefile_path), "manifest") for p in exc.problems)) from None
            self._check(package, spawner_package)
            name = package.runefile.name
            if name in taken:
                raise SpawnRefused(f"{name}@spawned is already running; kill it first or pick another name")
            final = self.root / name
            shutil.rmtree(final, ignore_errors=True)
            folder.rename(final)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        # No tools, workflow or other files (see _check): only the Runefile's path moved with the folder.
        runefile = package.runefile.model_copy(update={"networks": spawner_package.runefile.networks})
        return replace(package, root=final, runefile_path=final / "Runefile", files=(final / "Runefile",),
                       runefile=runefile, namespace="spawned")

    @staticmethod
    def _check(package: RunePackage, spawner: RunePackage) -> None:
        """Nothing the spawner could not do itself: its toolset entries only, no tools or servers of its own."""
        runefile = package.runefile
        extra = [entry for entry in runefile.toolset if entry not in spawner.runefile.toolset]
        if extra:
            raise SpawnRefused(f"toolset entries the spawner does not have: {', '.join(extra)} "
                               "(a spawned agent's tools must be a subset of its spawner's)")
        if runefile.tools or runefile.mcp_servers or package.workflow is not None:
            raise SpawnRefused("a spawned agent may not bring its own tools, MCP servers or workflow")
        if any(entry in ("rune@agent-spawn", "rune@agent-kill") for entry in runefile.toolset):
            raise SpawnRefused("a spawned agent may not spawn agents itself")

    async def remove(self, agent_id: str) -> Spawned | None:
        """Forget a spawned agent and delete its folder; None when it is not live."""
        async with self._lock:
            spawned = self.live.pop(agent_id, None)
            if spawned is not None:
                await trio.to_thread.run_sync(partial(shutil.rmtree, spawned.package.root, ignore_errors=True))
            return spawned

    def expired(self, now_ms: int) -> list[str]:
        return [agent_id for agent_id, s in self.live.items() if s.expires_ms <= now_ms]
