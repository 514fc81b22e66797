"""Supervised replicas: one long-lived process per Rune agent, started, restarted and stopped here.

A replica starts lazily at its agent's first dispatch (or at daemon start
with ``[rune] start = "eager"``); one life of its process is
:class:`~covenant.daemon.replica.ReplicaProcess`. Here, per replica, one
supervising task: a life that ends (a crash, three failed probes, a start
that never became healthy) is followed by a backoff (1 s doubling to 60 s,
reset after a minute of health) and a new life; ``restarts``, ``state`` and
``last_error`` show it in ``covenant status``. Invokes wait in the daemon for
the replica to be ready and for one of its ``concurrency_limit`` places.
A replica is stopped after ``[rune] idle_stop_s`` without requests, by
``covenant restart`` (drained, then started again), on reload when its
package changed (drained, then replaced) and when the daemon stops (after
its drain). With ``[rune] warm = 1`` a started spare process waits beside each
running replica and becomes its next life (:mod:`covenant.daemon.replica_spares`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.config import Config
from covenant.daemon.replica import REPLICAS_DIR, Offered, Replica, ReplicaFailed, ReplicaProcess
from covenant.daemon.intent_context import IntentContext
from covenant.daemon.replica_gateway import GatewayCalls
from covenant.daemon.replica_spares import SpareReplicas
from covenant.daemon.session_keeper import SessionKeeper
from covenant.manifest.model import AgentSpec
from covenant.manifest.runefile import RunePackage
from covenant.rune import wire
from covenant.runtime.runner import Runner

__all__ = ["ReplicaSupervisor", "Replica", "ReplicaFailed", "REPLICAS_DIR"]

log = logging.getLogger("covenant.rune")

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
HEALTHY_RESETS_BACKOFF_S = 60.0


class ReplicaSupervisor:
    """Every replica of one daemon. Run :meth:`run` in a nursery for the daemon's lifetime."""

    def __init__(
        self,
        *,
        state_dir: Path,
        config: Config,
        skills_dir: Path,
        runner: Runner,
        calls: GatewayCalls,
        offered_tools: Offered,
        session_key: Ed25519PrivateKey,
        audit: Callable[[str, dict[str, Any]], Awaitable[Any]] | None = None,
        on_stopped: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.root = state_dir / REPLICAS_DIR
        self.config = config
        self.sessions = SessionKeeper(state_dir / "sessions", session_key, audit=audit,
                                      suspicious=config.rune.suspicious)
        self.spares = SpareReplicas(runner, warm=config.rune.warm)
        self._forget_cpu_group = runner.plans.forget_cpu_group
        self.process = ReplicaProcess(state_dir=state_dir, config=config, skills_dir=skills_dir, runner=runner,
                                      calls=calls, offered_tools=offered_tools, sessions=self.sessions,
                                      spares=self.spares)
        self.on_stopped = on_stopped
        """Awaited (shielded) with the agent id when a replica stops for good: its MCP servers go with it."""
        self.on_restart: Callable[[str, str], None] | None = None
        """Called with the agent id and why (``exited``, ``operator``, ``reload``) when a replica is started again
        (the daemon's metrics)."""
        self.replicas: dict[str, Replica] = {}
        self._latest: dict[str, tuple[AgentSpec, RunePackage]] = {}
        """The package each agent has since the last reload (a dispatch that began before it may hold an older one)."""
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the supervising tasks; on cancellation every replica is stopped."""
        await trio.to_thread.run_sync(lambda: self.root.mkdir(parents=True, exist_ok=True, mode=0o700))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.spares.run)
                nursery.start_soon(self._idle_sweeper)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    # -- views and admin --------------------------------------------------------------

    def views(self) -> list[dict[str, Any]]:
        return [{**r.view(), "spare_pid": self.spares.pid(agent_id)} for agent_id, r in sorted(self.replicas.items())]

    def full(self, agent_id: str) -> bool:
        """Are all of the replica's ``concurrency_limit`` places taken?"""
        replica = self.replicas.get(agent_id)
        return replica is not None and replica.limiter.value == 0

    def waiting(self, agent_id: str) -> int:
        """Invokes of the agent waiting in the daemon (not yet on its replica)."""
        replica = self.replicas.get(agent_id)
        return replica.waiting if replica is not None else 0

    def ensure(self, agent: AgentSpec, package: RunePackage) -> Replica:
        """The agent's replica, its supervising task started if it is not running.

        A replica that is still running keeps its package until it is drained and replaced
        (:meth:`reconcile`); a new one always gets the package of the last reload.
        """
        agent, package = self._latest.get(agent.id, (agent, package))
        replica = self.replicas.get(agent.id)
        if replica is None or (replica.package is not package and replica.state == "stopped"):
            previous = replica
            replica = Replica(agent, package, self.root / agent.id)
            if previous is not None:
                replica.restarts = previous.restarts
            self.replicas[agent.id] = replica
        if replica.scope is None and self._nursery is not None:
            replica.stop_requested = False
            replica.scope = trio.CancelScope()
            self._nursery.start_soon(self._supervise, replica)
        return replica

    async def stop(self, agent_id: str, *, drain: bool = True, keep_spare: bool = False) -> None:
        """Stop a replica (after its in-flight invokes when ``drain``); its warm spare too, unless ``keep_spare``
        (a new life follows at once and takes it over)."""
        if not keep_spare:
            self.spares.discard(agent_id)
        replica = self.replicas.get(agent_id)
        if replica is None:
            return
        replica.stop_requested = True
        if replica.scope is not None:
            replica.set_state("stopping")
        if drain:
            await replica.idle.wait()
        if replica.scope is not None:
            replica.scope.cancel()
        while replica.scope is not None:
            await replica.changed.wait()

    async def restart(self, agent: AgentSpec, package: RunePackage) -> Replica:
        """``covenant restart``: drain and stop the agent's replica, then start a fresh one."""
        await self.stop(agent.id, drain=True, keep_spare=True)
        self._restarted(agent.id, "operator")
        return self.ensure(agent, package)

    async def reconcile(self, packages: dict[str, tuple[AgentSpec, RunePackage]], *, eager: bool) -> None:
        """After a reload: stop replicas of removed agents (and remove their CPU groups), drain and replace those
        whose package changed."""
        self._latest = dict(packages)
        for agent_id, replica in list(self.replicas.items()):
            current = packages.get(agent_id)
            if current is not None and current[1] == replica.package:
                continue
            running = replica.scope is not None
            await self.stop(agent_id, keep_spare=current is not None and (running or eager))
            if self.replicas.get(agent_id) is replica:  # an invoke may have put its successor there meanwhile
                del self.replicas[agent_id]
            if current is None and self._nursery is not None:
                # withdrawn: its CPU group goes too, without holding up the other agents' replacement
                self._nursery.start_soon(partial(trio.to_thread.run_sync, self._forget_cpu_group, agent_id))
            if current is not None and (running or eager):
                if running:
                    self._restarted(agent_id, "reload")
                self.ensure(*current)
        if eager:
            for agent, package in packages.values():
                self.ensure(agent, package)

    def reconcile_soon(self, packages: dict[str, tuple[AgentSpec, RunePackage]], *, eager: bool) -> None:
        """:meth:`reconcile` in the background (draining a replica must not hold up a reload)."""
        if self._nursery is not None:
            self._nursery.start_soon(partial(self.reconcile, packages, eager=eager))

    def restart_soon(self, agent_ids: list[str]) -> None:
        """Drain and restart, in the background, the replicas of ``agent_ids`` that run (a reload changed the
        tools they offer: a fresh replica is told its toolset, and its MCP servers start again with it)."""
        if self._nursery is None:
            return
        for agent_id in agent_ids:
            replica = self.replicas.get(agent_id)
            if replica is not None and replica.scope is not None:
                log.info("replica restart: a reload changed its tools", extra={"agent": agent_id})
                self._nursery.start_soon(self._stop_and_start, replica)

    async def _stop_and_start(self, replica: Replica) -> None:
        await self.stop(replica.agent.id, drain=True, keep_spare=True)
        if self.replicas.get(replica.agent.id) is replica:  # not removed by a reload meanwhile
            self.ensure(replica.agent, replica.package)

    async def stop_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for agent_id in list(self.replicas):
                nursery.start_soon(lambda a: self.stop(a, drain=False), agent_id)

    # -- invoke ----------------------------------------------------------------------

    async def invoke(
        self,
        agent: AgentSpec,
        package: RunePackage,
        body: dict[str, Any],
        context: IntentContext,
        *,
        emit: Callable[[str, Any], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """Send one intent to the agent's replica; the replica's answer, or ReplicaFailed.

        Waits (in the daemon) for the replica to be ready and for one of its
        ``concurrency_limit`` places. The caller bounds the whole with the
        intent's ``timeout_ms``; ``request_timeout_ms`` bounds the transport.
        """
        while True:
            replica = self.ensure(agent, package)
            if replica.scope is None:  # ensure starts nothing once the supervisor has stopped
                raise ReplicaFailed("cancelled", f"the replica of {agent.id} cannot start: the daemon is stopping")
            replica.waiting += 1
            try:
                if not await self._ready(replica):
                    continue  # stopped or replaced while we waited: look again
                await replica.limiter.acquire()
            finally:
                replica.waiting -= 1
            try:
                if await self._ready(replica):
                    return await self._invoke_on(replica, body, context, emit)
            finally:
                replica.limiter.release()

    async def _invoke_on(
        self, replica: Replica, body: dict[str, Any], context: IntentContext,
        emit: Callable[[str, Any], Awaitable[None]] | None,
    ) -> dict[str, Any]:
        """One invoke on a ready replica whose place the caller holds; bounded by request_timeout_ms."""
        agent, package = replica.agent, replica.package
        replica.intents[context.intent_id] = context
        replica.idle = trio.Event() if replica.idle.is_set() else replica.idle
        replica.last_used = time.monotonic()
        try:
            timeout_s = package.runefile.runtime.request_timeout_ms / 1000
            with trio.move_on_after(timeout_s):
                return await self._call(replica, body, emit)
            raise ReplicaFailed(
                "timeout",
                f"the replica of {agent.id} did not answer within request_timeout_ms = "
                f"{package.runefile.runtime.request_timeout_ms}",
            )
        finally:
            del replica.intents[context.intent_id]
            replica.last_used = time.monotonic()
            if not replica.intents:
                replica.idle.set()

    async def _ready(self, replica: Replica) -> bool:
        """Wait until ``replica`` is ready (True); False when it stopped or was replaced meanwhile.

        A start that failed (never healthy) fails the wait at once with ``spawn_failed``.
        """
        while replica.state != "ready":
            if replica.start_failed and replica.state == "backoff":
                raise ReplicaFailed("spawn_failed", f"the replica of {replica.agent.id} cannot start: {replica.last_error}")
            if replica.scope is None or self.replicas.get(replica.agent.id) is not replica:
                return False
            await replica.changed.wait()
        return self.replicas.get(replica.agent.id) is replica

    async def _call(
        self, replica: Replica, body: dict[str, Any], emit: Callable[[str, Any], Awaitable[None]] | None
    ) -> dict[str, Any]:
        lost = f"the replica of {replica.agent.id} (pid {replica.pid}) went away during the request; it is being restarted"
        try:
            if emit is None:
                status, document = await wire.call(replica.socket, "POST", "/invoke", body, peer_pid=replica.pid,
                                                   pool=replica.connections)
                return self._answer(replica, status, document)
            events = wire.stream(replica.socket, "/invoke", {**body, "stream": True}, peer_pid=replica.pid,
                                 pool=replica.connections)
            try:
                async for event, data in events:
                    if event == "done":
                        return self._answer(replica, 200, data)
                    if event == "error":
                        return self._answer(replica, 422, data)
                    if event == "response":
                        return self._answer(replica, data["status"], data["document"])
                    await emit(event, data)
            finally:
                await events.aclose()
        except wire.NotThePeer as exc:
            replica.probe_now.set()  # its probe finds the same and replaces it
            raise ReplicaFailed("crashed", f"the replica of {replica.agent.id} did not answer: {exc}, not the replica; "
                                           "it is being restarted") from None
        except wire.WireError as exc:
            raise ReplicaFailed("crashed", f"{lost} ({exc})") from None
        raise ReplicaFailed("crashed", lost)

    @staticmethod
    def _answer(replica: Replica, status: int, document: Any) -> dict[str, Any]:
        if not isinstance(document, dict):
            raise ReplicaFailed("protocol_error", f"the replica of {replica.agent.id} answered HTTP {status} without a JSON object")
        if status == 200:
            output = document.get("output")
            if not isinstance(output, dict) or not isinstance(output.get("text"), str):
                raise ReplicaFailed("protocol_error", f"the replica of {replica.agent.id} answered without output.text")
            return document
        error = document.get("error") if isinstance(document.get("error"), dict) else {}
        raise ReplicaFailed(str(error.get("code") or "protocol_error"), str(error.get("message") or f"HTTP {status}"),
                            document)

    # -- supervision -----------------------------------------------------------------

    async def _idle_sweeper(self) -> None:
        idle_s = self.config.rune.idle_stop_s
        if idle_s <= 0:
            return
        while True:
            await trio.sleep(min(idle_s / 4, 5.0))
            now = time.monotonic()
            for agent_id, replica in list(self.replicas.items()):
                if replica.scope is not None and not replica.intents and now - replica.last_used >= idle_s:
                    log.info("replica idle: stopping", extra={"agent": agent_id, "idle_s": idle_s})
                    self._nursery.start_soon(self.stop, agent_id)  # type: ignore[union-attr]

    def _restarted(self, agent_id: str, reason: str) -> None:
        if self.on_restart is not None:
            self.on_restart(agent_id, reason)

    async def _supervise(self, replica: Replica) -> None:
        backoff = BACKOFF_FIRST_S
        assert replica.scope is not None
        try:
            with replica.scope:
                while not replica.stop_requested:
                    started = time.monotonic()
                    try:
                        error = await self.process.run(replica)
                    except Exception as exc:  # a bug here must cost this replica a restart, never the daemon
                        log.exception("replica supervision failed", extra={"agent": replica.agent.id})
                        error = f"supervision error: {type(exc).__name__}: {exc}"
                    replica.pid = None
                    if replica.stop_requested:
                        break
                    if time.monotonic() - started > HEALTHY_RESETS_BACKOFF_S and not replica.start_failed:
                        backoff = BACKOFF_FIRST_S
                    replica.restarts += 1
                    self._restarted(replica.agent.id, "exited")
                    log.warning("replica down; restarting after backoff",
                                extra={"agent": replica.agent.id, "error": error, "backoff_s": backoff,
                                       "restarts": replica.restarts})
                    replica.set_state("backoff", error)
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
        finally:
            if self.on_stopped is not None:  # before the scope is cleared: stop() waits for it
                with trio.CancelScope(shield=True):
                    await self.on_stopped(replica.agent.id)
            replica.scope = None
            replica.pid = None
            replica.set_state("stopped")
