"""The agents a dispatch can reach: the registry's last scan, and the agents Rune agents spawned.

Owns what changes the set: a reload (rescan and merge, :mod:`covenant.daemon.agents_state`), a spawn,
a kill or an expiry of a ``<name>@spawned-<key id>`` agent (``rune@agent-spawn`` / ``agent-kill``), and an
operator's ``covenant stop`` / ``start`` (:mod:`covenant.daemon.stopped_agents`: a stopped agent stays
loaded but routing refuses it, and it has no replica); each change is published to the Rune host, whose
replicas follow it. A spawned agent takes a uid of the spawned sub-range when it is made and gives it back,
with its files, once it is removed and its uid runs nothing more.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import trio

from covenant.audit.events import AGENT_STARTED, AGENT_STOPPED
from covenant.audit.writer import AuditLog
from covenant.clock import now_ms
from covenant.config import Config
from covenant.daemon.agents_state import LoadedAgents, ReloadChanges, merge_reload
from covenant.daemon.metrics import Metrics
from covenant.daemon.registry_scan import scan_with_snapshots, snapshot_store
from covenant.daemon.routing import NoAgent, agent_stopped, route
from covenant.daemon.rune_host import RuneHost
from covenant.daemon.spawned import Spawned, SpawnedAgents, SpawnRefused
from covenant.daemon.stopped_agents import STOPPED_FILE, StoppedAgents
from covenant.errors import CovenantError
from covenant.home import Home
from covenant.manifest.limits import ManifestLimits
from covenant.manifest.model import AgentSpec
from covenant.runtime.isolation import Isolation
from covenant.runtime.launcher import LaunchError
from covenant.runtime.liveroots import LiveRoots
from covenant.spawned_ids import is_spawned_id, spawned_namespace
from covenant.workflow import ChainLink

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage

__all__ = ["LiveAgents"]

log = logging.getLogger("covenant.daemon")


class LiveAgents:
    """The loaded agents (:attr:`loaded`, with the live spawned ones) and the changes to them."""

    def __init__(
        self, *, home: Home, config: Config, loaded: LoadedAgents, rune: RuneHost, audit: AuditLog, metrics: Metrics,
        isolation: Isolation, live_roots: LiveRoots,
    ) -> None:
        self._home = home
        self._config = config
        self._rune = rune
        self._audit = audit
        self._metrics = metrics
        self._isolation = isolation
        self._live_roots = live_roots
        self.loaded = loaded
        self._snapshots = snapshot_store(home)
        self.spawned = SpawnedAgents(home.state_dir / "spawned", ManifestLimits.from_config(config.runtime),
                                     ttl_s=config.rune.spawned_ttl_s, per_spawner=config.rune.spawned_max,
                                     memory_mb=config.rune.memory_mb)
        self.stopped = StoppedAgents(home.state_dir / STOPPED_FILE)
        """Agents an operator stopped (``covenant stop``): routing refuses them; the daemon's start hands in the
        list it read (:meth:`use_stopped`)."""
        self._stop_lock = trio.Lock()
        rune.packages = loaded.packages
        metrics.set_registry(len(loaded.agents), loaded.rejected_files)

    def find(self, name: str) -> AgentSpec | None:
        """The loaded agent ``name`` (an id or a bare name) stands for, or None."""
        try:
            return route("", self.loaded.agents, requested=name)[0]
        except CovenantError:
            return None

    def reachable(self, spawner: str | None, issuer: str) -> dict[str, AgentSpec]:
        """Every loaded agent; spawned ones only for a child intent of their ``spawner``, for its ``issuer``."""
        if not self.spawned.live:
            return self.loaded.agents
        live = self.spawned.live
        return {agent_id: agent for agent_id, agent in self.loaded.agents.items()
                if agent_id not in live or (live[agent_id].spawner == spawner and live[agent_id].issuer == issuer)}

    # -- spawned agents (rune@agent-spawn / agent-kill) -------------------------------------

    async def spawn(self, parent: ChainLink, text: str) -> Spawned:
        """A new ``<name>@spawned-<key id>`` agent for ``parent``'s agent and issuer (SpawnRefused when it may not be)."""
        spawner, package = self.loaded.agents.get(parent.agent_id), self.loaded.packages.get(parent.agent_id)
        if spawner is None or package is None or parent.agent_id in self.spawned.live:
            raise SpawnRefused("only a Rune agent loaded from agents/ may spawn agents")
        spawned = await self.spawned.create(text, spawner=spawner, spawner_package=package,
                                            issuer=parent.issuer.pubkey, issuer_display=parent.issuer.display,
                                            now_ms=now_ms())
        try:  # its uid now, from the spawned sub-range: when none is free, no agent
            await trio.to_thread.run_sync(self._isolation.credentials_for, spawned.agent.id)
        except LaunchError as exc:
            await self.spawned.remove(spawned.agent.id)
            raise SpawnRefused(str(exc)) from None
        self._publish()
        await self._audit.record("agent.spawn", {"intent": parent.intent_id, **spawned.view(),
                                                 "toolset": list(spawned.package.runefile.toolset)})
        log.info("agent spawned", extra={"agent": spawned.agent.id, "spawner": spawned.spawner})
        return spawned

    async def kill(self, parent: ChainLink, agent_id: str) -> Spawned:
        """Remove a spawned agent; only its spawner (same agent, same issuer) may."""
        spawned = (self.spawned.live.get(agent_id)
                   or self.spawned.live.get(f"{agent_id}@{spawned_namespace(parent.issuer.pubkey)}"))
        if spawned is None or spawned.spawner != parent.agent_id or spawned.issuer != parent.issuer.pubkey:
            raise SpawnRefused(f"{agent_id} is not an agent this agent spawned for this issuer")
        await self.remove(spawned.agent.id, reason="killed", intent=parent.intent_id)
        return spawned

    async def remove(self, agent_id: str, *, reason: str, intent: str | None = None) -> None:
        """Stop the spawned agent's replica (its runs end as cancelled), then forget it."""
        await self._rune.replicas.stop(agent_id, drain=False)
        spawned = await self.spawned.remove(agent_id)
        if spawned is None:
            return
        self._publish()
        await self._audit.record("agent.kill", {"intent": intent, **spawned.view(), "reason": reason})
        log.info("spawned agent removed", extra={"agent": agent_id, "reason": reason})

    async def expire(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Remove spawned agents past ``[rune] spawned_ttl_s``, and give back the uids of removed ones that run
        nothing more, checked every second, until cancelled."""
        task_status.started()
        while True:
            for agent_id in self.spawned.expired(now_ms()):
                await self.remove(agent_id, reason="expired")
            if self.spawned.retiring:
                for agent_id in await self.spawned.retire(self._uid_busy, self._give_back):
                    log.info("spawned agent's uid and files given back", extra={"agent": agent_id})
            await trio.sleep(1)

    def _uid_busy(self, agent_id: str) -> bool:
        """Does anything still run as the agent's uid (a replica, a tool run, an MCP server)?"""
        creds = self._isolation.known_credentials(agent_id)
        return creds is not None and self._live_roots.live(creds.uid)

    def _give_back(self, agent_id: str) -> bool:
        """The ended spawned agent's files (workspace, sessions, memory and stores, replica folder) and CPU group
        removed and its uid freed for another (blocking); False while its uid still runs a process."""
        self._rune.tools.services.forget_agent(agent_id)
        # nothing runs as its uid now: also a group a tool process still held when the agent was removed
        self._rune.tools.services.runner.plans.forget_cpu_group(agent_id)
        for kind in ("sessions", "replicas"):
            shutil.rmtree(self._home.state_dir / kind / agent_id, ignore_errors=True)
        return self._isolation.retire(agent_id)

    def clear_spawned(self) -> None:
        """At start: the spawned agents of an earlier run, their folder, uids and files, are gone (blocking)."""
        self.spawned.clear(self._give_back, self._isolation.allocated())

    def _publish(self) -> None:
        """The loaded agents with the live spawned ones (after a spawn, a kill or a reload)."""
        agents = {k: v for k, v in self.loaded.agents.items() if not is_spawned_id(k)}
        packages = {k: v for k, v in self.loaded.packages.items() if not is_spawned_id(k)}
        for agent_id, spawned in self.spawned.live.items():
            agents[agent_id], packages[agent_id] = spawned.agent, spawned.package
        self.loaded = replace(self.loaded, agents=agents, packages=packages)
        self._rune.packages = self.loaded.packages
        self._rune.replicas.reconcile_soon(self.replica_packages(), eager=self._config.rune.start == "eager")

    def replica_packages(self) -> dict[str, tuple[AgentSpec, RunePackage]]:
        """Each Rune agent that may have a replica (a stopped one may not) with its package."""
        return {agent_id: (self.loaded.agents[agent_id], package) for agent_id, package in self.loaded.packages.items()
                if agent_id not in self.stopped}

    # -- covenant stop / start --------------------------------------------------------------

    def use_stopped(self, stopped: StoppedAgents) -> None:
        """At start, before serving: the agents stopped before the restart stay stopped (``stopped`` is loaded)."""
        self.stopped = stopped
        if self.stopped.entries:
            log.info("agents stopped by an operator stay stopped", extra={"agents": ",".join(sorted(self.stopped))})

    async def stop(self, agent_id: str, *, peer_uid: int | None) -> bool:
        """``covenant stop``: refuse new dispatches to ``agent_id`` from now on, across restarts; its in-flight
        dispatches finish, then its replica stops. False when it was stopped already (nothing recorded)."""
        async with self._stop_lock:
            if agent_id in self.stopped:
                return False
            await self._change_stopped(self.stopped.with_stopped(agent_id, now_ms(), peer_uid), AGENT_STOPPED,
                                       {"agent": agent_id, "peer_uid": peer_uid})
            self._publish()  # its replica drains (its in-flight invokes end first) and stops
        log.info("agent stopped", extra={"agent": agent_id, "peer_uid": peer_uid})
        return True

    async def start(self, agent_id: str, *, peer_uid: int | None) -> bool:
        """``covenant start``: ``agent_id`` takes dispatches again (a Rune agent's replica starts now). False when
        it was not stopped (nothing recorded)."""
        async with self._stop_lock:
            if agent_id not in self.stopped:
                return False
            await self._change_stopped(self.stopped.without(agent_id), AGENT_STARTED,
                                       {"agent": agent_id, "peer_uid": peer_uid})
            self._publish()
        agent, package = self.loaded.agents.get(agent_id), self.loaded.packages.get(agent_id)
        if agent is not None and package is not None:
            self._rune.replicas.ensure(agent, package)
        log.info("agent started", extra={"agent": agent_id, "peer_uid": peer_uid})
        return True

    async def _change_stopped(self, entries: dict[str, dict[str, Any]], event: str, data: dict[str, Any]) -> None:
        """Write ``entries`` durably, audit ``event``, then let them decide dispatches. When the event cannot be
        recorded the file is put back: no stop or start takes effect unaudited."""
        previous = self.stopped.entries
        await trio.to_thread.run_sync(self.stopped.save, entries)
        try:
            await self._audit.record(event, data)
        except BaseException:
            with trio.CancelScope(shield=True):
                try:
                    await trio.to_thread.run_sync(self.stopped.save, previous)
                except OSError as exc:
                    log.error("the list of stopped agents could not be put back after an unrecorded change; it "
                              "takes effect at the next start", extra={"path": str(self.stopped.path), "error": str(exc)})
            raise
        self.stopped.adopt(entries)

    # -- the registry ---------------------------------------------------------------------

    def use_config(self, config: Config) -> None:
        """The covenant.toml a reload applied: the next rescan checks agents against it."""
        self._config = config

    async def rescan(self) -> ReloadChanges:
        """Scan the agents folder again and load what it holds now; a manifest that became invalid runs its
        agent from the snapshot of its last valid package, or withdraws it when there is none (logged).
        The spawned agents stay."""
        fresh = await trio.to_thread.run_sync(scan_with_snapshots, self._home, self._config, self._snapshots)
        without_spawned = replace(
            self.loaded, agents={k: v for k, v in self.loaded.agents.items() if not is_spawned_id(k)},
            packages={k: v for k, v in self.loaded.packages.items() if not is_spawned_id(k)})
        self.loaded, changes = merge_reload(without_spawned, fresh)
        self._publish()
        for agent_id in changes.snapshot:
            log.warning(
                "agent runs its last valid version: its manifest was rejected",
                extra={"agent": agent_id, "path": str(self.loaded.snapshots[agent_id])},
            )
        for agent_id in changes.withdrawn:
            log.warning(
                "agent withdrawn: its manifest was rejected",
                extra={"agent": agent_id, "path": str(self.loaded.withdrawn[agent_id])},
            )
        return changes

    async def record_registry(self, *, reason: str, changes: dict[str, Any] | None = None) -> None:
        """Audit the registry state and each rejected manifest; log the problems."""
        self._metrics.set_registry(len(self.loaded.agents), self.loaded.rejected_files)
        rejected_by_file: dict[str, list[str]] = {}
        for problem in self.loaded.problems:
            rejected_by_file.setdefault(str(problem.path), []).append(str(problem))
            log.warning("manifest rejected", extra={"problem": str(problem)})
        for path, problems in sorted(rejected_by_file.items()):
            await self._audit.record("manifest.rejected", {"path": path, "problems": problems})
        await self._audit.record(
            "registry.loaded",
            {
                "reason": reason,
                "agents": sorted(self.loaded.agents),
                "rejected": len(rejected_by_file),
                **(changes or {}),
                "withdrawn": sorted(self.loaded.withdrawn),
                "snapshot": {agent_id: str(path) for agent_id, path in sorted(self.loaded.snapshots.items())},
            },
        )

    async def restart(self, agent_id: str, reload: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
        """``covenant restart AGENT``. A Rune agent's replica is drained and started afresh; any other agent has no
        process between dispatches, so its restart is ``reload()`` (the agents folder read again, as
        ``covenant reload``): its next dispatch runs what its file says now, and runs in flight finish as they
        began. A stopped agent is refused (``covenant start`` starts it)."""
        agent = self.loaded.agents[agent_id]
        if agent_id in self.stopped:
            raise agent_stopped(agent_id, "restart refused: ")
        if agent.runtime == "rune":
            return {"agent": agent_id, "restarted": "replica", "replica": await self.restart_replica(agent_id)}
        log.info("restart requested: reloading the agents folder", extra={"agent": agent_id})
        await reload()
        return {"agent": agent_id, "restarted": "reloaded"}

    async def restart_replica(self, agent_id: str) -> dict[str, Any]:
        """Drain the loaded Rune agent ``agent_id``'s replica and start a fresh one."""
        agent = self.loaded.agents[agent_id]
        if agent_id in self.stopped:
            raise agent_stopped(agent_id, "restart refused: ")
        if agent.runtime != "rune":
            raise NoAgent(f"agent {agent.id} is not a Rune agent: it has no replica to restart (runtime {agent.runtime})")
        log.info("replica restart requested", extra={"agent": agent.id})
        replica = await self._rune.replicas.restart(agent, self.loaded.packages[agent.id])
        return replica.view()
