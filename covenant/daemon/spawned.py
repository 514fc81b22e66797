"""Agents made at run time by ``rune@agent-spawn``: held by the daemon, never written to agents/.

A spawned agent is a Rune package built from the Runefile text an agent sent.
Its id is ``<name>@spawned-<the first 12 hex of the issuer's key>``
(:mod:`covenant.spawned_ids`): one issuer's helper never takes the name of
another's. Its files live under ``<home>/state/spawned/<id>/`` (readable by the
agent uids, written only by the daemon), and it is gone at ``rune@agent-kill``,
at ``[rune] spawned_ttl_s`` and at daemon stop (it never survives a restart:
the folder is emptied at start). It is never more than its spawner
(:mod:`covenant.manifest.spawn_bounds`: limits, budget, providers, safety,
toolset, networks), brings no tools, MCP servers or workflow of its own, and
spawns nothing; calls to it are child intents, so the spawner's issuer's
grants decide them. Once removed, its id waits in :attr:`SpawnedAgents.retiring`
until its uid runs nothing more, then the uid and the agent's files are given
back (:meth:`SpawnedAgents.retire`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import trio

from collections.abc import Callable

from covenant.errors import CovenantError, ExitCode
from covenant.manifest.limits import ManifestLimits
from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import ManifestError
from covenant.manifest.runefile import RunePackage, load_rune_package
from covenant.manifest.spawn_bounds import bounded_by
from covenant.spawned_ids import is_spawned_id, spawned_namespace

__all__ = ["Spawned", "SpawnedAgents", "SpawnRefused"]

log = logging.getLogger("covenant.daemon")

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

    def __init__(self, root: Path, limits: ManifestLimits, *, ttl_s: int, per_spawner: int,
                 memory_mb: Callable[[str], int]) -> None:
        self.root = root
        self.limits = limits
        self.ttl_ms = ttl_s * 1000
        self.per_spawner = per_spawner
        self.memory_mb = memory_mb
        """The memory limit of a ``resource_profile`` (``[rune] memory_*_mb``)."""
        self.live: dict[str, Spawned] = {}
        """Read and written on the event loop only; the file work runs in worker threads."""
        self.retiring: set[str] = set()
        """Removed agents whose uid and files are still to be given back (:meth:`retire`)."""
        self._lock = trio.Lock()
        """One spawn or removal at a time: two of them never build into, or delete, the same folder."""

    def clear(self, give_back: Callable[[str], bool], allocated: list[str]) -> None:
        """At start: whatever an earlier run left is removed (spawned agents never survive a restart), the uids
        and files of its spawned agents (``allocated`` of them) given back with ``give_back`` (blocking)."""
        for agent_id in allocated:
            if is_spawned_id(agent_id) and not give_back(agent_id):
                log.warning("a spawned agent of an earlier run could not be given back", extra={"agent": agent_id})
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)

    async def create(self, text: str, *, spawner: AgentSpec, spawner_package: RunePackage, issuer: str,
                     issuer_display: str, now_ms: int) -> Spawned:
        """A live ``<name>@spawned-<key id>`` agent from Runefile ``text`` for ``issuer`` (a public key);
        SpawnRefused naming what is wrong."""
        async with self._lock:
            if self.per_spawner == 0:
                raise SpawnRefused("spawning agents is off on this host ([rune] spawned_max = 0)")
            mine = sum(1 for s in self.live.values() if s.spawner == spawner.id and s.issuer == issuer)
            if mine >= self.per_spawner:
                raise SpawnRefused(f"{spawner.id} already holds {mine} spawned agents ([rune] spawned_max = "
                                   f"{self.per_spawner}); kill one first")
            if len(text.encode()) > MAX_MANIFEST_BYTES:
                raise SpawnRefused(f"the manifest is larger than {MAX_MANIFEST_BYTES // 1024} KiB")
            package = await trio.to_thread.run_sync(self._build, text, spawner_package, spawned_namespace(issuer),
                                                    frozenset(self.live))
            spawned = Spawned(package.to_agent_spec(), package, spawner.id, issuer, issuer_display, now_ms,
                              now_ms + self.ttl_ms)
            self.live[spawned.agent.id] = spawned
            return spawned

    def _build(self, text: str, spawner_package: RunePackage, namespace: str, taken: frozenset[str]) -> RunePackage:
        """Validate the Runefile in a fresh folder, bound it by its spawner's, then move it to ``<root>/<id>``
        (blocking)."""
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
            self._check(package)
            runefile, beyond = bounded_by(package.runefile, spawner_package.runefile, self.memory_mb)
            if beyond:
                raise SpawnRefused("a spawned agent is never more than its spawner: " + "; ".join(beyond))
            agent_id = f"{runefile.name}@{namespace}"
            if agent_id in taken:
                raise SpawnRefused(f"{agent_id} is already running; kill it first or pick another name")
            final = self.root / agent_id
            shutil.rmtree(final, ignore_errors=True)
            folder.rename(final)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        # No tools, workflow or other files (see _check): only the Runefile's path moved with the folder.
        return replace(package, root=final, runefile_path=final / "Runefile", files=(final / "Runefile",),
                       runefile=runefile, namespace=namespace)

    @staticmethod
    def _check(package: RunePackage) -> None:
        """No tools, MCP servers or workflow of its own, and no spawning (the toolset is bounded with the rest)."""
        runefile = package.runefile
        if runefile.tools or runefile.mcp_servers or package.workflow is not None:
            raise SpawnRefused("a spawned agent may not bring its own tools, MCP servers or workflow")
        if any(entry in ("rune@agent-spawn", "rune@agent-kill") for entry in runefile.toolset):
            raise SpawnRefused("a spawned agent may not spawn agents itself")

    async def remove(self, agent_id: str) -> Spawned | None:
        """Forget a spawned agent and delete its folder; None when it is not live. Its uid and files wait in
        :attr:`retiring`."""
        async with self._lock:
            spawned = self.live.pop(agent_id, None)
            if spawned is not None:
                self.retiring.add(agent_id)
                await trio.to_thread.run_sync(partial(shutil.rmtree, spawned.package.root, ignore_errors=True))
            return spawned

    async def retire(self, busy: Callable[[str], bool], give_back: Callable[[str], bool]) -> list[str]:
        """Give back the uid and files of each removed agent whose uid runs nothing more (``busy`` says, on the
        loop; ``give_back`` does it, blocking, in a worker thread, and says whether it could); the ids given
        back. One spawned again under the same id meanwhile keeps them."""
        given = []
        async with self._lock:
            for agent_id in sorted(self.retiring):
                if agent_id in self.live:
                    self.retiring.discard(agent_id)
                elif not busy(agent_id) and await trio.to_thread.run_sync(give_back, agent_id):
                    self.retiring.discard(agent_id)
                    given.append(agent_id)
        return given

    def expired(self, now_ms: int) -> list[str]:
        return [agent_id for agent_id, s in self.live.items() if s.expires_ms <= now_ms]
