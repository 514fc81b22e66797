"""One Rune agent's replica: its state, and one life of its process.

:class:`Replica` is what the daemon knows of a replica (state, pid,
restarts, in-flight intents); :class:`ReplicaProcess` runs one life of it:
claim the agent's uid, prepare its folder and gateway socket, launch
``python -m covenant.rune.host`` through the runner's launcher (own process
group, built environment, PDEATHSIG, ``RLIMIT_AS`` from ``resource_profile``),
write the replica spec on its stdin, wait until the health probe answers
within ``startup_timeout_ms``, probe every ``interval_ms``, and end the life
(killing the process group) when the process exits or three probes in a row
fail. The supervisor (:mod:`covenant.daemon.replicas`) decides when to start
one and what follows.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from covenant.config import Config
from covenant.daemon.intent_context import IntentContext
from covenant.daemon.replica_gateway import GatewayCalls, ReplicaGateway
from covenant.daemon.replica_spares import SpareReplicas
from covenant.daemon.session_keeper import SessionKeeper
from covenant.manifest.model import AgentSpec
from covenant.manifest.runefile import RunePackage
from covenant.rune import wire
from covenant.rune.spec import loop_settings
from covenant.runtime.environment import agent_environment
from covenant.runtime.launcher import AgentCredentials, Launched, LaunchError, LaunchPlan
from covenant.runtime.pdeathsig import GATE_BYTE
from covenant.runtime.runner import Runner
from covenant.runtime.stderr_lines import StderrLines

__all__ = ["Replica", "ReplicaFailed", "ReplicaProcess", "Offered", "REPLICAS_DIR", "PROBE_FAILURES_BEFORE_RESTART"]

log = logging.getLogger("covenant.rune")

REPLICAS_DIR = "replicas"
PROBE_FAILURES_BEFORE_RESTART = 3
_MIB = 1024 * 1024
_KILL_GRACE_S = 2.0


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
    uid: int | None = None
    """The agent uid it runs as (None: covenant's own, ``isolation: same-uid``); kept after it stops."""
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
    probe_now: trio.Event = field(default_factory=trio.Event)
    """Set when the replica exits, or an invoke found its socket served by another process: probe at
    once instead of at the next interval."""
    connections: wire.ConnectionPool | None = None
    """The invokes' and probes' kept-alive connections to this life of the process (None between lives)."""

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


class ReplicaProcess:
    """Runs lives of replica processes for one daemon (see the module docstring)."""

    def __init__(
        self, *, state_dir: Path, config: Config, skills_dir: Path, runner: Runner, calls: GatewayCalls,
        offered_tools: Offered, sessions: SessionKeeper, spares: SpareReplicas,
    ) -> None:
        self.runner = runner
        self.spares = spares
        self.root = state_dir / REPLICAS_DIR
        self.sessions = sessions
        self.config = config
        self.skills_dir = skills_dir
        self.calls = calls
        self.offered_tools = offered_tools

    async def run(self, replica: Replica) -> str:
        """Start the replica and supervise it until it dies or must go; returns why it ended."""
        replica.set_state("starting")
        try:
            settings = await trio.to_thread.run_sync(self._settings, replica)
        except Exception as exc:  # SkillError, OSError: the package cannot run as it is
            replica.start_failed = True
            return f"cannot prepare the replica: {exc}"
        creds = await self.runner.uids.claim(replica.agent.id, resident=True)
        try:
            return await self._run_as(replica, settings, creds)
        finally:
            with trio.CancelScope(shield=True):
                await self.runner.uids.release(creds, replica.agent.id, f"replica:{replica.agent.id}", resident=True)

    async def _run_as(self, replica: Replica, settings: dict[str, Any], creds: AgentCredentials | None) -> str:
        try:
            gateway_sock = await trio.to_thread.run_sync(self._prepare_folder, replica, creds)
        except OSError as exc:
            replica.start_failed = True
            return f"cannot prepare {replica.folder}: {exc}"
        gateway = ReplicaGateway(replica.agent.id, self.calls, replica.intents, self.sessions)
        plan = self._plan(replica, creds)
        launched = self.spares.take(replica.agent.id, plan)
        gate = b""  # a spare was let through its exec gate when it was launched
        if launched is None:
            try:
                # Its own network namespace with only a loopback: it reaches the daemon over unix sockets alone.
                launched = await self.runner.launch(plan, replica.agent, "off")  # a lasting thread
            except (LaunchError, OSError) as exc:
                gateway_sock.close()
                replica.start_failed = True
                return f"cannot start the replica: {exc}"
            gate = GATE_BYTE if launched.gated else b""
        else:
            log.info("replica started from its warm spare", extra={"agent": replica.agent.id, "pid": launched.pid})
        replica.pid = launched.pid
        replica.uid = creds.uid if creds is not None else None
        replica.connections = wire.ConnectionPool(replica.socket, launched.pid)
        reason = "the replica exited"
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(wire.serve, gateway_sock, gateway.handle, peer_pid=lambda: replica.pid,
                                            name=str(replica.gateway_socket)))
                nursery.start_soon(self._drain_output, replica, launched.stderr)
                nursery.start_soon(self._drain_output, replica, launched.stdout)
                spec_line = json.dumps({**settings, "socket": str(replica.socket), "gateway": str(replica.gateway_socket),
                                        "gateway_pid": os.getpid()}).encode() + b"\n"
                try:
                    await launched.stdin.send_all(gate + spec_line)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # it died already: wait_exit below says so
                try:
                    reason = await self._watch(replica, launched, nursery)
                except wire.NotThePeer as exc:  # a process of the agent's uid took the socket over
                    log.warning("the replica's socket is served by another process; restarting the replica",
                                extra={"agent": replica.agent.id, "pid": launched.pid, "error": str(exc)})
                    reason = f"its socket was taken over ({exc})"
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                replica.connections.close()
                replica.connections = None
                await launched.stop(_KILL_GRACE_S)
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
        replica.probe_now = trio.Event()

        async def wait_exit() -> None:
            await launched.wait_exit()
            exited.set()
            replica.probe_now.set()

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
        self.spares.fill_soon(replica.agent, partial(self._plan, replica))
        failures = 0
        while True:
            with trio.move_on_after(runtime.health_probe.interval_ms / 1000):
                await replica.probe_now.wait()
            replica.probe_now = trio.Event()
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
        """Is the replica healthy? Raises :class:`wire.NotThePeer` when another process serves its socket."""
        path = replica.package.runefile.runtime.health_probe.path
        with trio.move_on_after(2):
            try:
                status, _ = await wire.call(replica.socket, "GET", path, peer_pid=replica.pid, pool=replica.connections)
            except wire.NotThePeer:
                raise
            except wire.WireError:
                return False
            return status == 200
        return False

    async def _drain_output(self, replica: Replica, stream: trio.abc.ReceiveStream) -> None:
        lines = StderrLines.within(self.config.runtime, "replica stderr", {"agent": replica.agent.id})
        try:
            while data := await stream.receive_some(65536):
                lines.feed(data)
                await trio.sleep(lines.pause_s())  # over its log budget: the replica waits on a full pipe
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        lines.flush()

    def _settings(self, replica: Replica) -> dict[str, Any]:
        settings = loop_settings(
            replica.package,
            skills_dir=self.skills_dir,
            offered_tools=self.offered_tools(replica.agent, replica.package),
            standard_turns=self.config.rune.standard_turns,
            skill_prompt_kb=self.config.rune.skill_prompt_kb,
        )
        return {**settings, "health_path": replica.package.runefile.runtime.health_probe.path}

    def _prepare_folder(self, replica: Replica, creds: AgentCredentials | None) -> Any:
        """The replica's folder, 0700 and the agent uid's, its sessions folder, 0700 and the daemon's (the
        gateway reads and writes the sessions; files an older covenant let the replica write become the
        daemon's); the gateway socket.

        The gateway socket is the agent uid's too (so its replica can connect); inside the 0700
        folder nobody else reaches it, and the gateway serves only the replica's own pid.
        """
        self.root.mkdir(parents=True, exist_ok=True, mode=0o711)
        os.chmod(self.root, 0o711)
        self.sessions.sessions_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.sessions.sessions_dir, 0o700)
        owners = [(replica.folder, creds.uid if creds else None, creds.gid if creds else None),
                  (self.sessions.sessions_dir / replica.agent.id, os.getuid(), os.getgid())]
        for folder, uid, gid in owners:
            folder.mkdir(exist_ok=True, mode=0o700)
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                if uid is not None and gid is not None:
                    os.fchown(fd, uid, gid)
                    _chown_tree(folder, uid, gid)
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
            # It reaches only the daemon, over unix sockets: an empty network namespace where this
            # host can make one (rune-host.md, "Network"), the host's otherwise.
            isolate_network=True,
            network_required=False,
            pdeathsig=self.config.runtime.pdeathsig,
            credentials=creds,
        )


def _chown_tree(folder: Path, uid: int, gid: int) -> None:
    """Entries of ``folder`` owned by another uid (an earlier replica's, a uid change) become ``uid``'s.

    Symbolic links are not followed, and a file with more than one hard link is left alone: the folder
    is the agent uid's, and a link it made there to a file elsewhere (where ``fs.protected_hardlinks``
    is off) would otherwise hand that file to the agent.
    """
    for entry in os.scandir(folder):
        st = entry.stat(follow_symlinks=False)
        if st.st_uid == uid:
            continue
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            log.warning("a hard-linked file in a replica's folder is not given to the agent",
                        extra={"path": entry.path, "links": st.st_nlink})
            continue
        os.chown(entry.path, uid, gid, follow_symlinks=False)
