"""Supervised replicas: one long-lived process per Rune agent.

A replica is started through the same :class:`~covenant.runtime.launcher.Launcher`
as one-shot agents (own process group, built environment, PDEATHSIG,
``RLIMIT_AS`` from ``resource_profile``), lazily at its agent's first
dispatch (or at daemon start with ``[rune] start = "eager"``). Its folder
``<home>/state/replicas/<agent id>/`` (0700) holds ``replica.sock`` (the
replica's server) and ``gateway.sock`` (the daemon's gateway for it alone).

Lifecycle, per replica, in one supervising task: bind the gateway, launch,
write the replica spec on stdin, wait until the health probe answers within
``startup_timeout_ms`` (else the start failed), then probe every
``interval_ms``. A crash or three failed probes in a row: kill the group,
wait a backoff (1 s doubling to 60 s, reset after a minute of health) and
start again; ``restarts`` and ``last_error`` show it in ``covenant status``.
Stopped after ``[rune] idle_stop_s`` without requests, by ``covenant
restart`` (replaced), on reload when the package changed (drained, then
replaced) and when the daemon stops (after its drain).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from covenant.config import Config
from covenant.daemon.replica_gateway import GatewayCalls, IntentContext, ReplicaGateway
from covenant.manifest.model import AgentSpec
from covenant.manifest.runefile import RunePackage
from covenant.rune import wire
from covenant.rune.spec import loop_settings
from covenant.runtime import teardown
from covenant.runtime.environment import agent_environment
from covenant.runtime.launcher import AgentCredentials, Launched, LaunchError, LaunchPlan
from covenant.runtime.pdeathsig import GATE_BYTE
from covenant.runtime.runner import Runner

__all__ = ["ReplicaSupervisor", "Replica", "ReplicaFailed", "REPLICAS_DIR"]

log = logging.getLogger("covenant.rune")
agent_log = logging.getLogger("covenant.agent")

REPLICAS_DIR = "replicas"
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
HEALTHY_RESETS_BACKOFF_S = 60.0
PROBE_FAILURES_BEFORE_RESTART = 3
_MIB = 1024 * 1024
_KILL_GRACE_S = 2.0
_LOG_LINE_MAX = 4096


class ReplicaFailed(Exception):
    """An invoke could not be answered; ``outcome`` is the dispatch outcome."""

    def __init__(self, outcome: str, message: str, document: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message
        self.document = document or {}
        """The replica's error document (``session_id``, ``usage``) when it answered one."""


@dataclass
class Replica:
    """One agent's replica: its state as ``covenant status`` shows it, and its in-flight intents."""

    agent: AgentSpec
    package: RunePackage
    folder: Path
    state: str = "stopped"
    """stopped | starting | ready | backoff | stopping"""
    pid: int | None = None
    restarts: int = 0
    last_error: str | None = None
    start_failed: bool = False
    """The last start never became healthy (invokes fail fast instead of waiting)."""
    intents: dict[str, IntentContext] = field(default_factory=dict)
    waiting: int = 0
    """Invokes waiting in the daemon for the replica to be ready or for one of its places."""
    last_used: float = field(default_factory=time.monotonic)
    stop_requested: bool = False
    scope: trio.CancelScope | None = None
    limiter: trio.Semaphore = field(init=False)
    changed: trio.Event = field(default_factory=trio.Event)
    idle: trio.Event = field(default_factory=trio.Event)

    def __post_init__(self) -> None:
        self.limiter = trio.Semaphore(self.package.runefile.runtime.concurrency_limit)
        self.idle.set()

    @property
    def socket(self) -> Path:
        return self.folder / "replica.sock"

    @property
    def gateway_socket(self) -> Path:
        return self.folder / "gateway.sock"

    def set_state(self, state: str, error: str | None = None) -> None:
        self.state = state
        if error is not None:
            self.last_error = error
        self.changed.set()
        self.changed = trio.Event()

    def view(self) -> dict[str, Any]:
        return {
            "agent": self.agent.id,
            "state": self.state,
            "pid": self.pid,
            "restarts": self.restarts,
            "in_flight": len(self.intents),
            "waiting": self.waiting,
            "last_error": self.last_error,
        }


Offered = Callable[[AgentSpec, RunePackage], list[dict[str, Any]]]


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
        on_stopped: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.runner = runner
        self.launcher = runner.launcher
        self.root = state_dir / REPLICAS_DIR
        self.sessions_dir = state_dir / "sessions"
        self.config = config
        self.skills_dir = skills_dir
        self.calls = calls
        self.offered_tools = offered_tools
        self.on_stopped = on_stopped
        """Awaited (shielded) with the agent id when a replica stops for good: its MCP servers go with it."""
        self.replicas: dict[str, Replica] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the supervising tasks; on cancellation every replica is stopped."""
        await trio.to_thread.run_sync(lambda: self.root.mkdir(parents=True, exist_ok=True, mode=0o700))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._idle_sweeper)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    # -- views and admin --------------------------------------------------------------

    def views(self) -> list[dict[str, Any]]:
        return [r.view() for _, r in sorted(self.replicas.items())]

    def full(self, agent_id: str) -> bool:
        """Are all of the replica's ``concurrency_limit`` places taken?"""
        replica = self.replicas.get(agent_id)
        return replica is not None and replica.limiter.value == 0

    def waiting(self, agent_id: str) -> int:
        """Invokes of the agent waiting in the daemon (not yet on its replica)."""
        replica = self.replicas.get(agent_id)
        return replica.waiting if replica is not None else 0

    def ensure(self, agent: AgentSpec, package: RunePackage) -> Replica:
        """The agent's replica, its supervising task started if it is not running."""
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

    async def stop(self, agent_id: str, *, drain: bool = True) -> None:
        """Stop a replica (after its in-flight invokes when ``drain``)."""
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

    async def restart(self, agent_id: str) -> Replica:
        """``covenant restart``: drain and stop the replica, then start it again."""
        replica = self.replicas.get(agent_id)
        if replica is None:
            raise KeyError(agent_id)
        await self.stop(agent_id, drain=True)
        return self.ensure(replica.agent, replica.package)

    async def reconcile(self, packages: dict[str, tuple[AgentSpec, RunePackage]], *, eager: bool) -> None:
        """After a reload: stop replicas of removed agents, replace those whose package changed."""
        for agent_id, replica in list(self.replicas.items()):
            current = packages.get(agent_id)
            if current is None:
                await self.stop(agent_id)
                self.replicas.pop(agent_id, None)
            elif current[1] != replica.package:
                running = replica.scope is not None
                await self.stop(agent_id)
                self.replicas.pop(agent_id, None)
                if running or eager:
                    self.ensure(*current)
        if eager:
            for agent, package in packages.values():
                self.ensure(agent, package)

    def reconcile_soon(self, packages: dict[str, tuple[AgentSpec, RunePackage]], *, eager: bool) -> None:
        """:meth:`reconcile` in the background (draining a replica must not hold up a reload)."""
        if self._nursery is not None:
            self._nursery.start_soon(partial(self.reconcile, packages, eager=eager))

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
        replica = self.ensure(agent, package)
        replica.waiting += 1
        try:
            await self._ready(replica)
            await replica.limiter.acquire()
        finally:
            replica.waiting -= 1
        try:
            await self._ready(replica)
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
        finally:
            replica.limiter.release()

    async def _ready(self, replica: Replica) -> None:
        while replica.state != "ready":
            if replica.start_failed and replica.state == "backoff":
                raise ReplicaFailed("spawn_failed", f"the replica of {replica.agent.id} cannot start: {replica.last_error}")
            if replica.scope is None:
                self.ensure(replica.agent, replica.package)
            await replica.changed.wait()

    async def _call(
        self, replica: Replica, body: dict[str, Any], emit: Callable[[str, Any], Awaitable[None]] | None
    ) -> dict[str, Any]:
        lost = f"the replica of {replica.agent.id} (pid {replica.pid}) went away during the request; it is being restarted"
        try:
            if emit is None:
                status, document = await wire.call(replica.socket, "POST", "/invoke", body)
                return self._answer(replica, status, document)
            events = wire.stream(replica.socket, "/invoke", {**body, "stream": True})
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

    async def _supervise(self, replica: Replica) -> None:
        backoff = BACKOFF_FIRST_S
        assert replica.scope is not None
        try:
            with replica.scope:
                while not replica.stop_requested:
                    started = time.monotonic()
                    try:
                        error = await self._one_life(replica)
                    except Exception as exc:  # a bug here must cost this replica a restart, never the daemon
                        log.exception("replica supervision failed", extra={"agent": replica.agent.id})
                        error = f"supervision error: {type(exc).__name__}: {exc}"
                    replica.pid = None
                    if replica.stop_requested:
                        break
                    if time.monotonic() - started > HEALTHY_RESETS_BACKOFF_S and not replica.start_failed:
                        backoff = BACKOFF_FIRST_S
                    replica.restarts += 1
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

    async def _one_life(self, replica: Replica) -> str:
        """Start the replica and supervise it until it dies or must go; returns why it ended."""
        replica.set_state("starting")
        try:
            settings = await trio.to_thread.run_sync(self._settings, replica)
        except Exception as exc:  # SkillError, OSError: the package cannot run as it is
            replica.start_failed = True
            return f"cannot prepare the replica: {exc}"
        creds = await self.runner.claim_uid(replica.agent.id)
        try:
            return await self._run_as(replica, settings, creds)
        finally:
            if creds is not None:
                with trio.CancelScope(shield=True):
                    await self.runner.release_uid(creds, replica.agent.id, f"replica:{replica.agent.id}")

    async def _run_as(self, replica: Replica, settings: dict[str, Any], creds: AgentCredentials | None) -> str:
        try:
            gateway_sock = await trio.to_thread.run_sync(self._prepare_folder, replica, creds)
        except OSError as exc:
            replica.start_failed = True
            return f"cannot prepare {replica.folder}: {exc}"
        gateway = ReplicaGateway(replica.agent.id, self.calls, replica.intents, lambda: replica.pid)
        try:
            launched = await trio.to_thread.run_sync(self.launcher.launch, self._plan(replica, creds))
        except (LaunchError, OSError) as exc:
            gateway_sock.close()
            replica.start_failed = True
            return f"cannot start the replica: {exc}"
        replica.pid = launched.pid
        reason = "the replica exited"
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(wire.serve, gateway_sock, gateway.handle)
                nursery.start_soon(self._drain_output, replica, launched.stderr)
                nursery.start_soon(self._drain_output, replica, launched.stdout)
                spec_line = json.dumps({**settings, "socket": str(replica.socket),
                                        "gateway": str(replica.gateway_socket)}).encode() + b"\n"
                try:
                    await launched.stdin.send_all((GATE_BYTE if launched.gated else b"") + spec_line)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # it died already: wait_exit below says so
                reason = await self._watch(replica, launched, nursery)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._kill(launched)
                gateway_sock.close()
                status = launched.status
                if status is not None and reason == "the replica exited":
                    how = f"signal {status.signal}" if status.signal else f"exit code {status.exit_code}"
                    reason = f"the replica exited ({how})"
                log.info("replica stopped", extra={"agent": replica.agent.id, "pid": launched.pid, "reason": reason})
        return reason

    async def _watch(self, replica: Replica, launched: Launched, nursery: trio.Nursery) -> str:
        """Wait for health within startup_timeout_ms, then probe; return why it must go."""
        runtime = replica.package.runefile.runtime
        exited = trio.Event()

        async def wait_exit() -> None:
            await launched.wait_exit()
            exited.set()

        nursery.start_soon(wait_exit)
        deadline = trio.current_time() + runtime.startup_timeout_ms / 1000
        while not await self._probe(replica):
            if exited.is_set():
                replica.start_failed = True
                return "the replica exited before it became healthy"
            if trio.current_time() > deadline:
                replica.start_failed = True
                return f"the health probe did not answer within startup_timeout_ms = {runtime.startup_timeout_ms}"
            with trio.move_on_after(0.01):
                await exited.wait()
        replica.start_failed = False
        replica.set_state("ready")
        log.info("replica ready", extra={"agent": replica.agent.id, "pid": launched.pid})
        failures = 0
        while True:
            with trio.move_on_after(runtime.health_probe.interval_ms / 1000):
                await exited.wait()
            if exited.is_set():
                return "the replica exited"
            if await self._probe(replica):
                failures = 0
                continue
            failures += 1
            if failures >= PROBE_FAILURES_BEFORE_RESTART:
                return f"{failures} health probes in a row failed"

    @staticmethod
    async def _probe(replica: Replica) -> bool:
        path = replica.package.runefile.runtime.health_probe.path
        with trio.move_on_after(2):
            try:
                status, _ = await wire.call(replica.socket, "GET", path)
            except wire.WireError:
                return False
            return status == 200
        return False

    async def _kill(self, launched: Launched) -> None:
        if not launched.exited_now():
            teardown.signal_group(launched.pid, signal.SIGTERM)
            with trio.move_on_after(_KILL_GRACE_S):
                await launched.wait_exit()
        teardown.signal_group(launched.pid, signal.SIGKILL)
        with trio.move_on_after(10):
            await launched.wait_exit()
        if launched.exited_now():
            await trio.to_thread.run_sync(launched.reap)
        await launched.aclose()

    async def _drain_output(self, replica: Replica, stream: trio.abc.ReceiveStream) -> None:
        pending = b""
        try:
            while data := await stream.receive_some(65536):
                *lines, pending = (pending + data).split(b"\n")
                for raw in lines:
                    self._log_line(replica, raw)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        if pending:
            self._log_line(replica, pending)

    @staticmethod
    def _log_line(replica: Replica, raw: bytes) -> None:
        text = raw[:_LOG_LINE_MAX].decode("utf-8", "replace").rstrip("\r")
        agent_log.info("replica stderr", extra={"agent": replica.agent.id, "line": text})

    def _settings(self, replica: Replica) -> dict[str, Any]:
        settings = loop_settings(
            replica.package,
            skills_dir=self.skills_dir,
            offered_tools=self.offered_tools(replica.agent, replica.package),
            standard_turns=self.config.rune.standard_turns,
        )
        return {**settings, "health_path": replica.package.runefile.runtime.health_probe.path,
                "sessions_dir": str(self.sessions_dir)}

    def _prepare_folder(self, replica: Replica, creds: AgentCredentials | None) -> Any:
        """The replica's folder and its sessions folder, 0700 and the agent uid's; the gateway socket.

        The gateway socket is the agent uid's too (so its replica can connect); inside the 0700
        folder nobody else reaches it, and the gateway serves only the replica's own pid.
        """
        for parent in (self.root, self.sessions_dir):
            parent.mkdir(parents=True, exist_ok=True, mode=0o711)
            os.chmod(parent, 0o711)
        for folder in (replica.folder, self.sessions_dir / replica.agent.id):
            folder.mkdir(exist_ok=True, mode=0o700)
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                if creds is not None:
                    os.fchown(fd, creds.uid, creds.gid)
                    _chown_tree(folder, creds)
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        if replica.socket.exists() or replica.socket.is_symlink():
            replica.socket.unlink()
        sock = wire.bind_socket(replica.gateway_socket)
        if creds is not None:
            os.chown(replica.gateway_socket, creds.uid, creds.gid, follow_symlinks=False)
        return sock

    def _plan(self, replica: Replica, creds: AgentCredentials | None) -> LaunchPlan:
        rune = self.config.rune
        python = rune.python or sys.executable
        env = agent_environment(self.config.runtime, agent_id=replica.agent.id, intent_id=f"replica:{replica.agent.id}",
                                scratch=str(replica.folder), parent_env=os.environ)
        env["MALLOC_ARENA_MAX"] = "2"  # glibc reserves 64 MiB of address space per arena; RLIMIT_AS counts it
        memory = rune.memory_mb(replica.package.runefile.runtime.resource_profile) * _MIB
        return LaunchPlan(
            argv=(python, "-I", "-m", "covenant.rune.host"),
            env=env,
            cwd=str(replica.folder),
            rlimits={resource.RLIMIT_AS: (memory, memory), resource.RLIMIT_CORE: (0, 0)},
            pdeathsig=self.config.runtime.pdeathsig,
            credentials=creds,
        )


def _chown_tree(folder: Path, creds: AgentCredentials) -> None:
    """Files left by an earlier replica (a uid change) become the current uid's; links are not followed."""
    for entry in os.scandir(folder):
        if entry.stat(follow_symlinks=False).st_uid != creds.uid:
            os.chown(entry.path, creds.uid, creds.gid, follow_symlinks=False)
