"""Run one agent for one intent under limits, and say exactly how it ended.

:class:`Runner` owns the shared sampler and the set of in-flight dispatches.
``Runner.run`` never raises for an agent's fault: every fault is an
:data:`~covenant.runtime.outcome.Outcome` in the returned
:class:`~covenant.runtime.outcome.DispatchRecord`. Only trio cancellation of
the caller propagates, after the agent's whole process tree is gone.

Here: spawning, releasing, feeding and reading the agent, and the kill ladder.
The shared state of one run is :class:`~covenant.runtime.run_state.RunState`;
how a finished run is classified and recorded is :mod:`covenant.runtime.verdict`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import resource
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from functools import partial
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from covenant.clock import iso_ms, iso_now, now_ms
from covenant.config import Config, RuntimeConfig
from covenant.manifest.model import AgentSpec
from covenant.runtime import _procfs, host, teardown, uidkill
from covenant.runtime.contract import intent_line
from covenant.runtime.environment import agent_environment
from covenant.runtime.isolation import Isolation
from covenant.runtime.launcher import (
    AgentCredentials,
    Launched,
    Launcher,
    LaunchError,
    LaunchPlan,
    ProcessGroupLauncher,
)
from covenant.runtime.liveroots import LiveRoots
from covenant.runtime.mountns import MountNamespaces
from covenant.runtime.outcome import DispatchRecord, Outcome
from covenant.runtime.pdeathsig import GATE_BYTE
from covenant.runtime.run_state import RunState
from covenant.runtime.sampler import Sampler, adopted_orphans
from covenant.runtime.scratch import ScratchDirs, remove_owned_entries
from covenant.runtime.toolrun import ToolRun, tool_run_record
from covenant.runtime.workers import WorkerThreads
from covenant.runtime.verdict import build_record
from covenant.runtime.watch import RunWatch

__all__ = ["Runner", "SpawnHook", "PRIORITY_NICE", "WorkflowNotSupported", "paths_agent_processes_run"]

log = logging.getLogger("covenant.runtime")

PRIORITY_NICE: dict[str, int] = {"low": 10, "normal": 0, "high": -5}
"""Manifest ``[settlement] priority`` -> the agent's nice value."""

_MIB = 1024 * 1024
_PIPE_DRAIN_S = 5.0
"""After every process is dead, how long buffered output may take to arrive."""
_KILL_WAIT_S = 10.0
"""How long SIGKILL may take (a process in uninterruptible sleep dies late)."""
_STOPPING = "covenant stopped the run: the daemon is shutting down"
_GROUP_GONE_S = 2.0
"""After the sweep, how long a run's process group may take to empty (its last members dying)."""
_LAUNCH_THREADS = 2
"""Long-lived threads that launch Rune replicas and stdio MCP servers (see :meth:`Runner.launch`)."""
SHARED_TMP_DIRS = ("/dev/shm", "/tmp")
"""World-writable host dirs: without private ones (:mod:`~covenant.runtime.mountns`), what an agent
uid left there is removed and counted after its last run."""


SpawnHook = Callable[[dict[str, Any]], Awaitable[None]]
"""``on_spawned`` of :meth:`Runner.run`: gets ``{"pid", "argv", "limits"}`` once the agent exists."""


@dataclasses.dataclass(frozen=True)
class Released:
    """What :meth:`Runner.release_uid` found when it swept an agent uid."""

    left_bytes: int = 0
    """Bytes the uid left in its /tmp and /dev/shm (counted as the dispatch's disk use), now removed."""
    killed: int = 0
    """Live processes of the uid covenant had adopted (escapes from their run's tree), now killed."""


class WorkflowNotSupported(LaunchError):
    """A workflow agent reached the process runner (``covenant run``: workflows run only in the daemon's
    engine, :mod:`covenant.workflow`); outcome ``workflow_not_supported``."""


class Runner:
    """Spawns and supervises agent processes; one per daemon (or ``covenant run``).

    Use :meth:`open`::

        async with Runner.open(config.runtime, scratch_root=home.state_dir / "scratch") as runner:
            record = await runner.run(agent, payload)
    """

    def __init__(
        self,
        config: RuntimeConfig,
        scratch_root: Path,
        launcher: Launcher,
        sampler: Sampler,
        isolation: Isolation | None = None,
        live_roots: LiveRoots | None = None,
        mount_namespaces: MountNamespaces | None = None,
        *,
        launch_threads: WorkerThreads,
    ) -> None:
        self.config = config
        self.mount_namespaces = mount_namespaces
        """Each agent uid's private /tmp and /dev/shm; None: the host's (swept per uid instead)."""
        self.isolation = isolation or Isolation.same_uid()
        self.live_roots = live_roots or LiveRoots()
        """Shared with a replica supervisor: a uid is swept only when its last live root ends."""
        self.scratch_root = scratch_root
        self.scratch = ScratchDirs(scratch_root)
        # Long-lived: PR_SET_PDEATHSIG fires when the thread that spawned an agent exits.
        self._launch_threads = launch_threads
        self.launcher = launcher
        self.sampler = sampler
        self._interpreters = {
            "python3": (config.python3, self.resolve_program(config.python3, config.path)),
            "node": (config.node, self.resolve_program(config.node, config.path)),
        }
        self._subreaper = host.is_child_subreaper()
        self._dispatches: set[RunState] = set()
        self._stopping = False
        """Set by :meth:`cancel_all`: a run still starting then (claiming its uid, spawning) is cancelled
        as soon as it is started, before its agent is released."""
        self._starting: dict[str, str | None] = {}
        """Intent id -> None, or the reason it was cancelled, for each :meth:`run` not yet supervised:
        :meth:`cancel` can come while its uid is claimed or its process spawned."""
        self._sweeping: dict[int, trio.Event] = {}
        """uid -> set while that uid is being swept."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config: RuntimeConfig,
        *,
        scratch_root: Path,
        launcher: Launcher | None = None,
        isolation: Isolation | None = None,
        live_roots: LiveRoots | None = None,
        own_children: Callable[[], Collection[int]] = tuple,
        visible: Iterable[str] = (),
    ) -> AsyncIterator["Runner"]:
        """Start the shared sampler and scratch keeper; on exit stop every run still in flight, then (as
        child subreaper) SIGKILL every child left that is not one of covenant's own: see
        :meth:`end_adopted_orphans`.

        Interpreters are resolved to absolute paths here, once, not per
        dispatch, and so is the PDEATHSIG wrapper (a one-time test exec).
        ``isolation`` decides the uid of every agent (default: covenant's own,
        ``same-uid``); ``live_roots`` is the per-uid registry shared with
        other supervisors of agent processes. ``own_children`` gives the
        pids of covenant's other long-lived children (the audit writer):
        never an agent's, so never attributed, swept or reaped. ``visible``
        names further paths every agent process must still see when a private
        /tmp covers the host's (a replica's interpreter, stdio MCP servers).
        """
        scratch_root = Path(scratch_root)
        enforced = isolation is not None and isolation.enforced

        def make_root() -> None:
            scratch_root.mkdir(parents=True, exist_ok=True, mode=0o700)
            # Agent uids must traverse to their own scratch dir (0700, theirs) but not list the others.
            os.chmod(scratch_root, 0o711 if enforced else 0o700)

        await trio.to_thread.run_sync(make_root)
        if config.pdeathsig:
            wrapper = await trio.to_thread.run_sync(host.pdeathsig_wrapper)
            if wrapper is None:
                log.warning(
                    "agents start without PDEATHSIG: neither covenant's helper (x86-64 only) nor "
                    "`setpriv --pdeathsig` runs here; install util-linux's setpriv, or set "
                    "runtime.pdeathsig = false to accept it (docs/runtime.md, PDEATHSIG)"
                )
            if enforced:
                await trio.to_thread.run_sync(partial(host.pdeathsig_wrapper, credentials=True))
        async with WorkerThreads.open(_LAUNCH_THREADS, "covenant-launch") as launch_threads:
            mount_namespaces = None
            if enforced:  # the probe namespace's holder is PDEATHSIG-armed: a launch thread, not trio's cache
                mount_namespaces = await launch_threads.run(
                    cls._private_tmp, config, scratch_root, isolation, list(visible)
                )

            def helper_pids() -> Collection[int]:
                holders = mount_namespaces.holder_pids if mount_namespaces is not None else frozenset()
                return holders.union(own_children())

            sampler = Sampler(config.sample_interval_ms, helper_pids)
            runner = cls(
                config, scratch_root, launcher or ProcessGroupLauncher(), sampler, isolation, live_roots,
                mount_namespaces, launch_threads=launch_threads,
            )
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sampler.run)
                    nursery.start_soon(runner.scratch.run)
                    try:
                        yield runner
                    finally:
                        with trio.CancelScope(shield=True):
                            if runner._dispatches:
                                runner.cancel_all()
                                bound = config.kill_grace_ms / 1000 + _KILL_WAIT_S + _PIPE_DRAIN_S
                                with trio.move_on_after(bound):
                                    while runner._dispatches:
                                        await trio.sleep(0.01)
                            await runner.end_adopted_orphans()
                        nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(runner.scratch.close)
                    if mount_namespaces is not None:
                        await trio.to_thread.run_sync(mount_namespaces.close)

    @classmethod
    def _private_tmp(
        cls, config: RuntimeConfig, scratch_root: Path, isolation: Isolation | None, visible: list[str]
    ) -> MountNamespaces | None:
        """Private /tmp and /dev/shm per agent uid when this host allows them (one probe namespace)."""
        import covenant

        needed = [str(scratch_root), sys.executable, os.path.dirname(covenant.__file__), *visible]
        needed += [p for p in (cls.resolve_program(config.python3, config.path),
                               cls.resolve_program(config.node, config.path)) if p]
        spaces = MountNamespaces(scratch_root.parent / "isolation" / "stage", needed)
        problem = None
        if not config.pdeathsig:
            problem = "runtime.pdeathsig = false: agents start without covenant's exec helper, which enters it"
        elif not spaces.available():
            problem = "covenant's credentialed exec helper is not available here (x86-64 only)"
        else:
            try:
                spaces.namespace_for(0, 1, [])  # uid 0 is never an agent's: a probe, closed at once
            except OSError as exc:
                problem = str(exc)
            spaces.close()
        if problem is None:
            return spaces
        message = f"no private /tmp and /dev/shm for agents ({problem}); what agent uids leave there is removed after their runs"
        log.warning("agents share the host's /tmp and /dev/shm", extra={"detail": message})
        if isolation is not None:
            isolation.problems.append(message)
        return None

    @staticmethod
    def resolve_program(name: str, path: str) -> str | None:
        """Absolute path of an interpreter: as given when absolute, else looked up on ``path``."""
        if os.path.isabs(name):
            return name if os.access(name, os.X_OK) and os.path.isfile(name) else None
        found = shutil.which(name, path=path)
        return os.path.abspath(found) if found else None

    def interpreter(self, runtime: str) -> str | None:
        """The absolute path of ``[runtime] python3`` or ``node`` (resolved at start), or None when missing."""
        return self._interpreters[runtime][1]

    @property
    def in_flight(self) -> int:
        """Runs started and not yet finished."""
        return len(self._dispatches)

    def cancel(self, intent_id: str, reason: str) -> bool:
        """Stop the run of ``intent_id`` through the kill ladder (outcome ``cancelled``); False when none is running.

        A run still starting is cancelled as soon as its process exists, before its agent is released.
        """
        if intent_id in self._starting:
            self._starting[intent_id] = reason
            return True
        found = [dispatch for dispatch in self._dispatches if dispatch.intent_id == intent_id]
        for dispatch in found:
            dispatch.decide("cancelled", reason)
        return bool(found)

    def cancel_all(self) -> None:
        """Covenant is stopping: every in-flight run, and every run still starting or started from now on,
        ends through the kill ladder with outcome ``cancelled``."""
        self._stopping = True
        for dispatch in list(self._dispatches):
            dispatch.decide("cancelled", _STOPPING)

    # -- one run -------------------------------------------------------------------------

    def _budgets(self, agent: AgentSpec) -> tuple[int, int]:
        """(wall ms, CPU ms): CPU = cpu_ms_per_task; wall = that plus runtime.wall_grace_ms."""
        cpu_ms = agent.resources.cpu_ms_per_task
        return cpu_ms + self.config.wall_grace_ms, cpu_ms

    def _limits(self, agent: AgentSpec) -> dict[str, Any]:
        wall_ms, cpu_ms = self._budgets(agent)
        res = agent.resources
        return {
            "cpu_ms_per_task": res.cpu_ms_per_task,
            "wall_ms": wall_ms,
            "cpu_ms": cpu_ms,
            "memory_mb": res.memory_mb,
            "disk_mb": res.disk_mb,
            "network": res.network,
            "priority": agent.settlement.priority,
            "nice": PRIORITY_NICE[agent.settlement.priority],
            "stdout_cap_bytes": self.config.stdout_cap_bytes,
        }

    def _argv(self, agent: AgentSpec) -> list[str]:
        """The agent's command line by runtime; raise LaunchError naming what is missing."""
        if agent.runtime == "workflow":
            raise WorkflowNotSupported(
                f"agent {agent.id} is a workflow agent ({agent.manifest_path}); workflows run only in the daemon "
                "(`covenant dispatch` with a running daemon), not under `covenant run`"
            )
        if agent.runtime == "rune":
            raise LaunchError(
                f"agent {agent.id} is a Rune package (runtime = \"rune\"): the process runner does not spawn "
                "Rune agents; the daemon and `covenant run` run them as replicas (docs/rune-packages.md)"
            )
        entry = agent.entry
        if entry is None:
            raise LaunchError(f"agent {agent.id} ({agent.manifest_path}) has no entry to run")
        if not entry.is_file():
            raise LaunchError(f"agent {agent.id}: entry {entry} does not exist or is not a file ({agent.manifest_path})")
        if agent.runtime == "rust-bin":
            if not os.access(entry, os.X_OK):
                raise LaunchError(f"agent {agent.id}: entry {entry} is not executable (chmod +x, or rebuild it)")
            return [str(entry)]
        configured, resolved = self._interpreters[agent.runtime]
        if resolved is None:
            raise LaunchError(
                f"agent {agent.id} needs the {agent.runtime} interpreter, but {configured!r} was not found "
                f"(looked on runtime.path {self.config.path!r}); install it or set runtime.{agent.runtime} "
                "in covenant.toml to its absolute path"
            )
        return [resolved, str(entry)]

    def _launch(
        self,
        agent: AgentSpec,
        intent_id: str,
        argv: list[str],
        scratch: str | None,
        cpu_ms: int,
        creds: AgentCredentials | None,
        mount_namespace: str | None,
        cwd: str | None = None,
    ) -> tuple[str | None, Launched | LaunchError | OSError]:
        """Make the scratch dir if none was ready, build the plan, spawn (blocking; any thread).

        ``intent_id`` is the run's marker (the intent's id for an agent, a
        unique run id for a tool); ``mount_namespace`` is the uid's private
        /tmp (:meth:`_private_tmp_off_the_loop`). Returns the scratch dir with the process,
        or with the error, so the caller can give the dir back either way.
        """
        try:
            if scratch is None:
                scratch = self.scratch.make()
            if creds is not None:
                os.chown(scratch, creds.uid, creds.gid)  # its HOME and TMPDIR: 0700, the agent's own
            env = agent_environment(
                self.config, agent_id=agent.id, intent_id=intent_id, scratch=scratch, parent_env=os.environ
            )
            plan = LaunchPlan(
                argv=tuple(argv),
                env=env,
                cwd=cwd or str(agent.root),
                nice=PRIORITY_NICE[agent.settlement.priority],
                rlimits=self._rlimits(agent, cpu_ms, creds),
                isolate_network=agent.resources.network == "off",
                network_required=self.config.network_enforcement == "strict",
                pdeathsig=self.config.pdeathsig,
                credentials=creds,
                mount_namespace=mount_namespace,
                spawn_on_this_cpu=self.in_flight > 0,
            )
            return scratch, self.launcher.launch(plan)
        except (LaunchError, OSError) as exc:
            return scratch, exc

    def private_tmp(self, agent: AgentSpec, creds: AgentCredentials | None) -> str | None:
        """The mount namespace every process of ``agent`` enters: its uid's private /tmp and /dev/shm.

        None when agents share the host's. Blocking on a uid's first use: it starts the namespace's
        holder (~15 ms), which dies with the thread that started it (PDEATHSIG), so call this only
        from the loop's thread or a launch thread, never a trio worker. Raises OSError when it cannot
        be made. The agent's package folder and entry stay visible in it, with the paths given to
        :meth:`open` as ``visible``.
        """
        if creds is None or self.mount_namespaces is None:
            return None
        needed = [str(agent.root), *([str(agent.entry)] if agent.entry else [])]
        return self.mount_namespaces.namespace_for(creds.uid, agent.resources.disk_mb, needed)

    def _rlimits(self, agent: AgentSpec, cpu_ms: int, creds: AgentCredentials | None) -> dict[int, tuple[int, int]]:
        # A per-process backstop a little above the tree budget the sampler enforces:
        # SIGXCPU at the soft limit, SIGKILL from the kernel at the hard one.
        cpu_s = math.ceil(cpu_ms / 1000) + 1
        fsize = agent.resources.disk_mb * _MIB
        limits = {
            resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),
            resource.RLIMIT_FSIZE: (fsize, fsize),
            resource.RLIMIT_CORE: (0, 0),
        }
        if creds is not None:
            # Counted by the kernel per real uid: a fork bomb of the agent's whole tree (and of
            # every concurrent run of it) stops here. Same-uid agents would count covenant's own.
            nproc = self.isolation.max_processes
            limits[resource.RLIMIT_NPROC] = (nproc, nproc)
        return limits

    async def run(
        self, agent: AgentSpec, payload: dict[str, Any], *, on_spawned: SpawnHook | None = None,
        deadline: float | None = None,
    ) -> DispatchRecord:
        """Run ``agent`` once with ``payload`` on stdin; return how it went.

        Never raises for a fault of the agent. If the calling task is
        cancelled, the process tree is torn down (shielded) and Cancelled
        propagates.

        ``on_spawned`` is awaited once, as soon as the agent process exists,
        with ``{"pid": int, "argv": [str], "limits": {str: int | str}}``, and
        before the agent gets its intent line. Behind the gated PDEATHSIG
        helper (the default on x86-64) the agent has not even been exec'd
        then: it runs only after the hook returned. If the hook raises, the
        agent never starts (or, ungated, is torn down through the kill
        ladder) and ``run`` re-raises that exception instead of returning a
        record (fail closed).

        ``deadline`` (trio time) ends the run earlier than its own budget would (outcome ``timeout``): a
        child intent never outlives the intent that called it.
        """
        intent_id = str(payload.get("id", ""))
        started_at = iso_now()
        t0 = time.monotonic()
        base = self._record_base(agent, intent_id, started_at)
        argv: list[str] = []
        wall_ms, cpu_ms = self._budgets(agent)
        self._starting[intent_id] = None
        try:
            argv = self._argv(agent)
            scratch, launched, creds = await self._spawn(agent, intent_id, argv, cpu_ms)
        except (LaunchError, OSError) as exc:
            message = str(exc) if isinstance(exc, LaunchError) else f"cannot prepare agent {agent.id}: {exc}"
            log.warning("spawn failed", extra={"agent": agent.id, "intent": intent_id, "detail": message})
            outcome = "workflow_not_supported" if isinstance(exc, WorkflowNotSupported) else "spawn_failed"
            return DispatchRecord.without_process(
                t0=t0, **base, argv=argv, pid=None, outcome=outcome, error=message, result=None
            )
        finally:
            cancelled_while_starting = self._starting.pop(intent_id)
        dispatch = RunState(agent, intent_id, launched, base["limits"], wall_ms / 1000, cpu_ms, deadline)
        if creds is not None:
            base["uid"] = creds.uid
        if cancelled_while_starting is not None:
            dispatch.decide("cancelled", cancelled_while_starting)  # before it is supervised: never released
        scratch_bytes = await self._run_to_end(dispatch, scratch, creds, intent_line(payload), on_spawned)
        if dispatch.hook_error is not None:
            raise dispatch.hook_error
        return build_record(dispatch, base, t0, scratch_bytes, self.config.stderr_tail_bytes)

    def never_started(self, agent: AgentSpec, intent_id: str, outcome: Outcome, error: str, *, t0: float) -> DispatchRecord:
        """The record of an intent whose agent never started, e.g. one cancelled while it waited for a slot
        (``t0``: :func:`time.monotonic` when it was accepted, its ``started_at``)."""
        started_at = iso_ms(now_ms() - int((time.monotonic() - t0) * 1000))
        return DispatchRecord.without_process(
            t0=t0, **self._record_base(agent, intent_id, started_at), argv=[], pid=None, outcome=outcome, error=error,
            result=None,
        )

    def _record_base(self, agent: AgentSpec, intent_id: str, started_at: str) -> dict[str, Any]:
        return {
            "intent_id": intent_id,
            "agent_id": agent.id,
            "agent_version": agent.version,
            "runtime": agent.runtime,
            "limits": self._limits(agent),
            "started_at": started_at,
            "isolation": self.isolation.mode,
        }

    async def run_tool(
        self,
        agent: AgentSpec,
        argv: Sequence[str],
        document: bytes,
        *,
        run_id: str,
        wall_ms: int,
        cwd: str | None = None,
        on_started: Callable[[RunState], None] | None = None,
    ) -> ToolRun:
        """Run a process tool of ``agent`` once: ``document`` on stdin, one JSON document expected on stdout.

        The tool mode of the runner (docs/tools.md): the same launch plan as
        the agent's own processes (its environment allowlist, memory and disk
        limits, nice, network, PDEATHSIG, process group, scratch dir as
        HOME/TMPDIR, cwd the package folder), the same sampler and kill
        ladder; only the budgets differ: ``wall_ms`` of wall-clock time from
        release, and as much CPU time. ``run_id`` marks every process of the
        run (``COVENANT_INTENT_ID``) and must be unique among runs in flight.
        Never raises for a fault of the tool; on cancellation the tree is torn
        down (shielded) and Cancelled propagates.
        """
        t0 = time.monotonic()
        cpu_ms = wall_ms
        try:
            scratch, launched, creds = await self._spawn(agent, run_id, list(argv), cpu_ms, cwd)
        except (LaunchError, OSError) as exc:
            message = str(exc) if isinstance(exc, LaunchError) else f"cannot prepare the tool: {exc}"
            log.warning("tool spawn failed", extra={"agent": agent.id, "intent": run_id, "detail": message})
            return ToolRun.spawn_failed(list(argv), message, t0)
        limits = {**self._limits(agent), "wall_ms": wall_ms, "cpu_ms": cpu_ms}
        run = RunState(agent, run_id, launched, limits, wall_ms / 1000, cpu_ms)
        if on_started is not None:
            on_started(run)
        scratch_bytes = await self._run_to_end(run, scratch, creds, document, None)
        return tool_run_record(run, t0, scratch_bytes, self.config.stderr_tail_bytes)

    async def launch(self, plan: LaunchPlan, agent: AgentSpec) -> Launched:
        """Launch ``plan``, a process of ``agent``, in its uid's private /tmp (raises LaunchError/OSError).

        For processes started outside :meth:`run` (Rune replicas, stdio MCP servers), from one of
        the runner's launch threads: PR_SET_PDEATHSIG fires when the *thread* that spawned a process
        exits, and trio's thread cache retires a worker idle for 10 s, which would kill a process
        launched from it with SIGKILL. The same holds for the private /tmp's holder, which the uid's
        first process may start here.
        """

        def start() -> Launched:
            private_tmp = self.private_tmp(agent, plan.credentials)
            return self.launcher.launch(dataclasses.replace(plan, mount_namespace=private_tmp))

        return await self._launch_threads.run(start)

    async def _private_tmp_off_the_loop(self, agent: AgentSpec, creds: AgentCredentials | None) -> str | None:
        """:meth:`private_tmp`, on a launch thread when the uid has no holder yet: starting one takes
        ~15 ms, which the loop does not wait through. (A holder that died is replaced on the loop.)"""
        if creds is not None and self.mount_namespaces is not None and not self.mount_namespaces.held(creds.uid):
            return await self._launch_threads.run(self.private_tmp, agent, creds)
        return self.private_tmp(agent, creds)

    async def _spawn(
        self, agent: AgentSpec, marker: str, argv: list[str], cpu_ms: int, cwd: str | None = None
    ) -> tuple[str, Launched, AgentCredentials | None]:
        """Claim the agent's uid, take (or make) a scratch dir and start the process.

        On failure the uid and the dir are given back and the error is raised.
        """
        creds = await self.claim_uid(agent.id)
        scratch = self.scratch.take(creds.uid if creds is not None else os.getuid())
        made: str | None
        launched: Launched | LaunchError | OSError
        try:
            private_tmp = await self._private_tmp_off_the_loop(agent, creds)
        except OSError as exc:
            made, launched = scratch, exc
        else:
            # On the loop even while others run: on a thread the spawn's Python shares the GIL with the
            # loop anyway, and the hand-offs cost more than the vfork wait they spare the loop (16
            # concurrent clients: 2-7 % more dispatches per s, 7-11 % less CPU; docs/performance.md).
            made, launched = self._launch(agent, marker, argv, scratch, cpu_ms, creds, private_tmp, cwd)
        if isinstance(launched, Exception):
            with trio.CancelScope(shield=True):
                if creds is not None:
                    await self.release_uid(creds, agent.id, marker)
                if made is not None:
                    await self.scratch.give_back(made)
            raise launched
        assert made is not None
        return made, launched, creds

    async def _run_to_end(
        self, d: RunState, scratch: str, creds: AgentCredentials | None, stdin: bytes, on_spawned: SpawnHook | None
    ) -> int:
        """Supervise a started run until its whole tree is gone; return the bytes it left behind.

        Those are what is left in its scratch dir, plus, when it was the last
        live run of its uid, what the uid left in the shared temp dirs.
        """
        self._dispatches.add(d)
        if self._stopping:  # cancel_all came while this run was being spawned: its agent is never released
            d.decide("cancelled", _STOPPING)
        self.sampler.register(d.tree, d.check_limits)
        scratch_bytes = 0
        try:
            try:
                await self._supervise(d, stdin, on_spawned)
            except BaseException:
                d.decide("cancelled", "the run was cancelled by its caller")
                raise
            finally:
                with trio.CancelScope(shield=True):
                    await self._finish(d)
                    released = await self.release_uid(creds, d.agent.id, d.intent_id) if creds is not None else Released()
                    d.left_behind += released.killed
                    scratch_bytes = await self.scratch.give_back(scratch) + released.left_bytes
        finally:
            self.sampler.unregister(d.tree)
            self._dispatches.discard(d)
        return scratch_bytes

    async def _supervise(self, d: RunState, line: bytes, on_spawned: SpawnHook | None) -> None:
        """Release the agent, then feed, read and watch until the root exits or a limit is crossed.

        The wall-clock budget starts when the agent is released, not while
        the spawn hook runs.
        """
        if on_spawned is not None:
            await self._call_hook(d, on_spawned)
        rest = b""
        if d.verdict is None:  # not if the hook failed or the run was cancelled meanwhile (cancel_all)
            d.deadline = trio.current_time() + d.wall_s
            if d.caller_deadline is not None:
                d.deadline = min(d.deadline, d.caller_deadline)
            rest = self._write_stdin_now(d, GATE_BYTE + line if d.launched.gated else line)
        if not rest and not d.keep_stdin_open:
            d.launched.stdin.close()  # without the gate byte, a gated helper kills itself
        await self._watch(d, rest)

    async def _call_hook(self, d: RunState, on_spawned: SpawnHook) -> None:
        info = {"pid": d.launched.pid, "argv": list(d.launched.argv), "limits": dict(d.limits)}
        try:
            await on_spawned(info)
        except Exception as exc:
            d.hook_error = exc
            d.decide("cancelled", f"the spawn hook failed, so the agent was stopped before it got its intent: {exc!r}")

    @staticmethod
    def _write_stdin_now(d: RunState, line: bytes) -> bytes:
        """Write what fits in the pipe without waiting (all of a normal intent); return the rest."""
        try:
            written = os.write(d.launched.stdin.fileno(), line)
        except BlockingIOError:
            written = 0
        except OSError:
            return b""  # the agent exited or closed stdin without reading: its output decides
        return line[written:]

    async def _watch(self, d: RunState, rest: bytes) -> None:
        """Read the agent's output until its root exits, a limit is crossed or the wall clock runs out;
        then the kill ladder, then what is still buffered in the pipes."""
        watch = RunWatch(d, self.config)
        try:
            if rest:  # an intent larger than the pipe: fed by a task of its own meanwhile
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._feed_stdin, d, rest)
                    await self._watch_to_end(d, watch)
                    nursery.cancel_scope.cancel()
            else:
                await self._watch_to_end(d, watch)
        finally:
            watch.close()

    async def _watch_to_end(self, d: RunState, watch: RunWatch) -> None:
        await watch.until_exit_or_decided(d.deadline)
        if watch.root_exited and d.launched.status is None:
            self._collect_root(d)
        elif d.verdict is None and d.launched.status is None:
            wall_ms = round(d.wall_s * 1000)
            if d.deadline == d.caller_deadline:
                d.decide("timeout", f"the agent did not finish before the intent that called it had to end "
                                    f"(its own wall-clock budget is {wall_ms} ms)")
            else:
                d.decide("timeout", f"the agent did not finish within its wall-clock budget of {wall_ms} ms")
        await self._terminate(d, watch.await_root)
        await watch.drain(_PIPE_DRAIN_S)

    async def _feed_stdin(self, d: RunState, line: bytes) -> None:
        stream = d.launched.stdin
        try:
            await stream.send_all(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the agent exited or closed stdin without reading: its output decides
        finally:
            if not d.keep_stdin_open:
                stream.close()

    def _collect_root(self, d: RunState) -> None:
        """The root has exited: kill what is left of its group, take the last sample, reap it.

        The group is signalled while the root is still an unreaped zombie, so
        its pid — the group id — cannot have been reused.
        """
        teardown.signal_group(d.launched.pid, signal.SIGKILL)
        if d.tree.has_descendants():
            d.tree.refresh()  # last figures of the other members (the root's come from wait4)
        d.launched.reap()

    @staticmethod
    async def _await_root(d: RunState, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the root to exit, on its pidfd alone (the pipes are not read)."""
        with trio.move_on_after(timeout):
            await d.launched.wait_exit()
            return True
        return False

    async def _terminate(self, d: RunState, await_root: Callable[[float], Awaitable[bool]] | None = None) -> None:
        """The kill ladder: SIGTERM to the group, grace, SIGKILL to the group and every survivor.

        Survivors are found by the tree walk, covenant's adopted orphans and,
        when covenant is not a subreaper, a scan for the intent's marker.
        Whatever the outcome, no process of the dispatch remains. ``await_root``
        waits for the root's exit with a timeout (default: :meth:`_await_root`).
        """
        await_root = await_root or partial(self._await_root, d)
        pid = d.launched.pid
        if not d.launched.exited_now():
            d.tree.refresh()
            teardown.signal_group(pid, signal.SIGTERM)
            teardown.signal_processes(d.tree.members, signal.SIGTERM, signalled_group=pid)
            grace_ms = self.config.kill_grace_ms
            if not await await_root(grace_ms / 1000):
                d.notes.append(f"the agent ignored SIGTERM for {grace_ms} ms and was killed with SIGKILL")
                d.tree.refresh()
                teardown.signal_group(pid, signal.SIGKILL)
                teardown.signal_processes(d.tree.members, signal.SIGKILL, signalled_group=pid)
                if not await await_root(_KILL_WAIT_S):
                    log.error(
                        "agent survived SIGKILL",
                        extra={"agent": d.agent.id, "intent": d.intent_id, "pid": pid},
                    )
                    return
        if d.launched.status is None:
            self._collect_root(d)
        await self._sweep(d)

    async def _sweep(self, d: RunState) -> None:
        """SIGKILL every process of the dispatch still alive after its root is gone, and reap them."""
        tree = d.tree
        # Attributing against every in-flight tree spares reading the environment
        # of the other dispatches' roots and known members.
        others = (o.tree for o in self._dispatches if o is not d)
        adopted = adopted_orphans([tree, *others], self.sampler.foreign, self.sampler.helper_pids()).get(tree, [])
        if adopted or tree.has_descendants():
            tree.refresh(adopted)
        victims = {pid: start for pid, start in tree.members.items() if pid != tree.root}
        if not self._subreaper:
            exclude = {os.getpid(), tree.root, *victims}
            victims.update(await trio.to_thread.run_sync(teardown.marked_processes, tree.marker, exclude))
        if victims:
            d.left_behind += len(victims)
            teardown.signal_processes(victims, signal.SIGKILL)
            left = await teardown.await_gone(victims, _KILL_WAIT_S)
            if left:
                log.error(
                    "agent processes survived SIGKILL",
                    extra={"agent": d.agent.id, "intent": d.intent_id, "pids": sorted(left)},
                )
                return
        await self._reap_group_zombies(tree.root)
        d.swept = True

    async def _reap_group_zombies(self, group: int) -> None:
        """Reap the dead members of a finished run's process group that covenant adopted meanwhile.

        A zombie whose parent died after the sweep looked at it is reparented
        to covenant (the child subreaper) later; with another live root of the
        uid (a replica) no uid sweep comes to reap it, and zombies count
        against the uid's RLIMIT_NPROC. Only zombies of the run's own group
        (pgid = its root's pid) are taken, never another child of covenant.
        Members killed a moment ago may still be dying, or become covenant's
        only once their own parent is dead, so as child subreaper covenant
        waits until the group is empty, for at most ``_GROUP_GONE_S``; the
        usual run leaves nothing, and one ``killpg(group, 0)`` says so.
        """
        deadline = trio.current_time() + _GROUP_GONE_S
        while True:
            reaped = self._reap_zombies(self._strangers(), group=group)
            left = reaped or (self._subreaper and teardown.group_exists(group))
            if not left or trio.current_time() > deadline:
                return
            if not reaped:
                await trio.sleep(0.005)

    async def claim_uid(self, agent_id: str, *, resident: bool = False) -> AgentCredentials | None:
        """The agent's credentials, registered as a live root of its uid before anything runs as it.

        Waits while a sweep of that uid is under way (it would kill the new run).
        None in ``same-uid`` mode. Every process covenant starts for an agent
        (a one-shot run or a tool run here; a Rune replica or a stdio MCP server elsewhere, which
        are ``resident``) is claimed so, put in ``LaunchPlan.credentials``, and given back with
        :meth:`release_uid` once its process tree is gone.
        """
        if not self.isolation.enforced:
            return None
        creds = self.isolation.known_credentials(agent_id)
        if creds is None:  # first run of this agent: the allocation table is written
            creds = await trio.to_thread.run_sync(self.isolation.credentials_for, agent_id)
        assert creds is not None
        while (sweeping := self._sweeping.get(creds.uid)) is not None:
            await sweeping.wait()
        self.live_roots.add(creds.uid, resident=resident)
        return creds

    async def release_uid(
        self, creds: AgentCredentials | None, agent_id: str, intent_id: str, *, resident: bool = False
    ) -> Released:
        """The run's tree is gone: if it was the last live root of its uid, sweep the uid.

        Kills every process still running as the uid (escapes that left the
        tree: setsid, double fork, emptied environment; see
        :meth:`_strangers` for when), reaps those covenant adopted, and
        empties the uid's private /tmp and /dev/shm (or removes what it left
        in :data:`SHARED_TMP_DIRS`); returns those bytes (they count as the
        dispatch's disk use) and how many live processes of the uid covenant
        had adopted and killed (without child subreaper the kill is blind: 0).
        When only resident roots of the uid are left (a Rune replica, stdio
        MCP servers: the run was a tool run, or one of them stopped), the
        processes of the uid covenant adopted are killed one by one instead,
        and the resident ones go on (:mod:`covenant.runtime.liveroots`).
        New runs of the uid wait until the sweep is over.

        Without credentials (``same-uid`` mode) there is no uid to sweep: the orphans covenant adopted
        that still carry ``intent_id`` as their marker are ended instead (:meth:`end_adopted_orphans`).
        A one-shot run's sweep has ended those already, so it skips this call.
        """
        if creds is None:
            await self.end_adopted_orphans(intent_id)
            return Released()
        self.live_roots.remove(creds.uid, resident=resident)
        if self.live_roots.passing(creds.uid):
            return Released()
        done = self._sweeping[creds.uid] = trio.Event()
        try:
            if self.live_roots.live(creds.uid):
                return await self._end_escapes_of(creds.uid, agent_id, intent_id)
            return await self._sweep_uid(creds, agent_id, intent_id)
        finally:
            del self._sweeping[creds.uid]
            done.set()

    async def _end_escapes_of(self, uid: int, agent_id: str, intent_id: str) -> Released:
        """Only resident roots of ``uid`` are left: kill, one by one, its processes covenant adopted (they
        left the tree they were started in), and reap them; the resident ones are no strangers and go on.

        Without child subreaper covenant adopts nothing, and an escape of the uid cannot be told from a
        resident root's own process: it lives until the uid's last root ends.
        """
        if not self._subreaper:
            return Released()
        ended = await self._end_strangers(lambda pid: _procfs.read_real_uid(pid) == uid)
        if ended:
            log.warning("killed processes agents left behind", extra={"agent": agent_id, "intent": intent_id,
                                                                       "pids": sorted(ended)})
        return Released(0, len(ended))

    async def _sweep_uid(self, creds: AgentCredentials, agent_id: str, intent_id: str) -> Released:
        """The uid's last live root ended: kill every process of it, reap those covenant adopted, and empty
        (and measure) what it left in its private /tmp and /dev/shm or the shared temp dirs."""

        def of_uid(pid: int) -> bool:
            return _procfs.read_real_uid(pid) == creds.uid  # a zombie has no uid here

        strangers = self._strangers()
        killed = sum(1 for pid in strangers if of_uid(pid))
        if not self._subreaper or killed:
            if not await trio.to_thread.run_sync(uidkill.kill_uid, creds.uid, creds.gid):
                log.error("cannot sweep agent uid", extra={"agent": agent_id, "intent": intent_id, "uid": creds.uid})
            await self._end_strangers(of_uid)  # the strangers among them, reaped as they die
        else:
            self._reap_zombies(strangers)
        if self.mount_namespaces is not None:
            if not self.mount_namespaces.used_bytes(creds.uid):
                return Released(0, killed)  # nothing left there (the usual case): no thread hop
            return Released(await trio.to_thread.run_sync(self.mount_namespaces.collect, creds.uid), killed)
        return Released(await trio.to_thread.run_sync(remove_owned_entries, SHARED_TMP_DIRS, creds.uid), killed)

    async def end_adopted_orphans(self, marker: str | None = None) -> None:
        """SIGKILL and reap the orphans covenant adopted as child subreaper: those whose environment
        still holds ``COVENANT_INTENT_ID=marker``, or, without a marker, every one.

        A process an agent, a replica or an MCP server left in a session of its own survives the kill
        of its group. With uid isolation the uid sweep ends it. In ``same-uid`` mode, when a replica or
        server stops, :meth:`release_uid` ends its marked orphans here; live replicas and servers are
        children of the launch threads, never strangers, so one agent's other servers (same marker) are
        safe. At close, once every run, replica and server has stopped, :meth:`open` ends the rest,
        marked or not.
        """
        if not self._subreaper:
            return
        if marker is None:
            ended = await self._end_strangers(lambda pid: _procfs.read_real_uid(pid) is not None)
        else:
            marked = f"COVENANT_INTENT_ID={marker}".encode()
            ended = await self._end_strangers(lambda pid: _procfs.environ_has(pid, marked))
        if ended:
            log.warning("killed processes agents left behind", extra={"pids": sorted(ended), "intent": marker})

    async def _end_strangers(self, matches: Callable[[int], bool]) -> set[int]:
        """SIGKILL every stranger (:meth:`_strangers`) that ``matches`` (it must not match a zombie), and
        those that match among the strangers they leave in turn (a dying stranger's children come to
        covenant), and reap each as it dies; returns the pids killed.

        A stranger is covenant's child, so its pid cannot be reused before covenant reaps it: killing
        by pid is safe. SIGKILL takes effect when each process is next scheduled, so the loop waits
        (for at most ``_KILL_WAIT_S``) until none of them is still dying, or they would stay zombies.
        """
        deadline = trio.current_time() + _KILL_WAIT_S
        ended: set[int] = set()
        dying: set[int] = set()
        while True:
            strangers = self._strangers()
            found = [pid for pid in strangers if pid not in dying and matches(pid)]
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                dying.add(pid)
            ended.update(found)
            alive = [pid for pid in strangers if pid in dying and _alive(pid)]
            dying.difference_update(self._reap_zombies(strangers))  # after the look: what died before it
            if not found and not alive:
                return ended
            if trio.current_time() > deadline:
                log.error("processes left by agents survived SIGKILL", extra={"pids": sorted(alive)})
                return ended
            await trio.sleep(0.005)

    def _strangers(self) -> list[int]:
        """covenant's children that are neither the root of a run in flight nor a mount namespace holder.

        As child subreaper covenant is the parent of last resort of every process an agent starts:
        once a run's tree is gone, anything left of its uid is such a stranger (an orphan covenant
        adopted), or a descendant of one. So the uid kill (a process spawn, ~0.3 ms) runs only when a
        stranger has the uid; without subreaper it always runs. Usually there is none, and one read
        of covenant's children list is all this costs.
        """
        known = {o.launched.pid for o in self._dispatches}
        helpers = self.sampler.helper_pids()
        return [pid for pid in _procfs.thread_children(os.getpid()) if pid not in known and pid not in helpers]

    @staticmethod
    def _reap_zombies(strangers: list[int], *, group: int | None = None) -> list[int]:
        """Reap the zombies among ``strangers`` (orphans covenant adopted as child subreaper), only those of
        process group ``group`` when given (never its leader, a run's root); returns their pids."""
        reaped = []
        for pid in strangers:
            stat = _procfs.read_stat(pid)
            if stat is None or stat.state != "Z" or (group is not None and (stat.pgrp != group or pid == group)):
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped.append(pid)
            except ChildProcessError:
                pass
        return reaped

    async def _finish(self, d: RunState) -> None:
        """Make sure the tree is gone and our ends are closed (also on cancellation)."""
        if d.launched.status is None or not d.swept:
            await self._terminate(d)
        d.launched.close()


def _alive(pid: int) -> bool:
    """Is ``pid`` there and not a zombie?"""
    stat = _procfs.read_stat(pid)
    return stat is not None and stat.state != "Z"


def paths_agent_processes_run(config: Config) -> list[str]:
    """Paths outside agents' packages that replicas and stdio MCP servers run, for :meth:`Runner.open`'s
    ``visible``: kept visible (bound back) when an agent uid's private /tmp covers the host's."""
    paths = [config.rune.python] if config.rune.python else []
    for server in config.mcp.values():
        program = Runner.resolve_program(server.command[0], config.runtime.path)
        paths += [*([program] if program else []), *server.named_paths()]
    return paths
