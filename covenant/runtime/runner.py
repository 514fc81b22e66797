"""Run one agent for one intent under limits, and say exactly how it ended.

:class:`Runner` owns the shared sampler and the set of in-flight dispatches.
``Runner.run`` never raises for an agent's fault: every fault is an
:data:`~covenant.runtime.outcome.Outcome` in the returned
:class:`~covenant.runtime.outcome.DispatchRecord`. Only trio cancellation of
the caller propagates, after the agent's whole process tree is gone.

Here: spawning, releasing, feeding and reading the agent. What it is launched
with is :mod:`covenant.runtime.launch_plans`; its uid is claimed and swept by
:mod:`covenant.runtime.uid_leases`; its tree is ended by the kill ladder,
:mod:`covenant.runtime.kill_ladder`. The shared state of one run is
:class:`~covenant.runtime.run_state.RunState`; how a finished run is classified
and recorded is :mod:`covenant.runtime.verdict`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from functools import partial
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from covenant.clock import iso_ms, iso_now, now_ms
from covenant.config import Config, RuneConfig, RuntimeConfig
from covenant.manifest.model import AgentSpec
from covenant.runtime import _elf, host, hostnet
from covenant.runtime.contract import intent_line
from covenant.runtime.cpu_class import CpuGroups
from covenant.runtime.disk_use import ENTRIES_PER_TICK, DiskUse, TreeScan
from covenant.runtime.isolation import Isolation
from covenant.runtime.kill_ladder import KillLadder, collect_root
from covenant.runtime.launch_plans import (
    LaunchPlans,
    WorkflowNotSupported,
    agent_networks,
    private_tmp_namespaces,
    resolve_program,
)
from covenant.runtime.launcher import (
    AgentCredentials,
    Launched,
    Launcher,
    LaunchError,
    LaunchPlan,
    ProcessGroupLauncher,
)
from covenant.runtime.liveroots import LiveRoots
from covenant.runtime.mountns import MountNamespaces, inodes_for
from covenant.runtime.netns import AgentNetworks, HeldNamespaces, NetworkMode
from covenant.runtime.outcome import DispatchRecord, Outcome
from covenant.runtime.pdeathsig import GATE_BYTE
from covenant.runtime.run_state import RunState
from covenant.runtime.sampler import Sampler
from covenant.runtime.scratch import ScratchDirs
from covenant.runtime.teardown import KILL_WAIT_S
from covenant.runtime.tool_confinement import ToolConfinement
from covenant.runtime.tool_files import ToolFiles
from covenant.runtime.toolrun import ToolRun, tool_run_record
from covenant.runtime.uid_leases import Released, UidLeases
from covenant.runtime.workers import WorkerThreads
from covenant.runtime.tree_removal import Removal
from covenant.runtime.verdict import build_record
from covenant.runtime.watch import RunWatch

__all__ = ["Runner", "SpawnHook", "paths_agent_processes_run"]

log = logging.getLogger("covenant.runtime")

_PIPE_DRAIN_S = 5.0
"""After every process is dead, how long buffered output may take to arrive."""
_STOPPING = "covenant stopped the run: the daemon is shutting down"
_LAUNCH_THREADS = 2
"""Long-lived threads that launch Rune replicas and stdio MCP servers (see :meth:`Runner.launch`)."""


SpawnHook = Callable[[dict[str, Any]], Awaitable[None]]
"""``on_spawned`` of :meth:`Runner.run`: gets ``{"pid", "argv", "limits"}`` once the agent exists."""


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
        networks: AgentNetworks | None = None,
        *,
        launch_threads: WorkerThreads,
        tool_confinement: ToolConfinement,
        rune: RuneConfig | None = None,
        cpu_groups: CpuGroups | None = None,
    ) -> None:
        self.config = config
        self.mount_namespaces = mount_namespaces
        """Each agent uid's private /tmp and /dev/shm; None: the host's (swept per uid instead)."""
        self.isolation = isolation or Isolation.same_uid()
        self.scratch_root = scratch_root
        self.scratch = ScratchDirs(scratch_root)
        # Long-lived: PR_SET_PDEATHSIG fires when the thread that spawned an agent exits.
        self._launch_threads = launch_threads
        self.launcher = launcher
        self.sampler = sampler
        self.plans = LaunchPlans(config, self.isolation, mount_namespaces, networks, rune=rune, cpu_groups=cpu_groups)
        """What each agent process is launched with."""
        self.tool_confinement = tool_confinement
        """Whether tool processes' files are confined here (Landlock), and their rulesets."""
        self._dispatches: set[RunState] = set()
        subreaper = host.is_child_subreaper()
        self.uids = UidLeases(
            self.isolation, live_roots or LiveRoots(), mount_namespaces, subreaper=subreaper,
            helper_pids=sampler.helper_pids, run_roots=lambda: (d.launched.pid for d in self._dispatches),
        )
        """Agent uids: claimed by every process covenant starts for an agent, swept when given back."""
        self._ladder = KillLadder(config.kill_grace_ms, sampler, self.uids, subreaper=subreaper,
                                  runs=lambda: self._dispatches)
        self._stopping = False
        """Set by :meth:`cancel_all`: a run still starting then (claiming its uid, spawning) is cancelled
        as soon as it is started, before its agent is released."""
        self._starting: dict[str, str | None] = {}
        """Intent id -> None, or the reason it was cancelled, for each :meth:`run` not yet supervised:
        :meth:`cancel` can come while its uid is claimed or its process spawned."""

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
        rune: RuneConfig | None = None,
        cpu_groups: CpuGroups | None = None,
    ) -> AsyncIterator["Runner"]:
        """Start the shared sampler and scratch keeper; on exit stop every run still in flight, then (as
        child subreaper) SIGKILL every child left that is not one of covenant's own: see
        :meth:`UidLeases.end_adopted_orphans <covenant.runtime.uid_leases.UidLeases.end_adopted_orphans>`.

        Interpreters are resolved to absolute paths here, once, not per
        dispatch, and so is the PDEATHSIG wrapper (a one-time test exec).
        ``isolation`` decides the uid of every agent (default: covenant's own,
        ``same-uid``); ``live_roots`` is the per-uid registry shared with
        other supervisors of agent processes. ``own_children`` gives the
        pids of covenant's other long-lived children (the audit writer):
        never an agent's, so never attributed, swept or reaped. ``visible``
        names further paths every agent process must still see when a private
        /tmp covers the host's (a replica's interpreter, stdio MCP servers).
        ``rune`` gives Rune agents' classes of ``resource_profile`` (nice, memory, CPU
        cores) and ``cpu_groups`` the kernel groups that hold them to their CPU share
        (the daemon's; without them, nice only): :mod:`covenant.runtime.cpu_class`.
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
        tool_confinement = await trio.to_thread.run_sync(ToolConfinement.for_host, config, enforced)
        async with WorkerThreads.open(_LAUNCH_THREADS, "covenant-launch") as launch_threads:
            mount_namespaces = None
            networks, host_table = None, None
            if enforced:  # the probe namespaces' holders are PDEATHSIG-armed: a launch thread, not trio's cache
                assert isolation is not None
                mount_namespaces = await launch_threads.run(
                    private_tmp_namespaces, config, scratch_root, isolation, list(visible)
                )
                networks, host_table = await launch_threads.run(agent_networks, config, isolation)

            def helper_pids() -> Collection[int]:
                holders = mount_namespaces.holder_pids if mount_namespaces is not None else frozenset()
                network_helpers = networks.helper_pids if networks is not None else frozenset()
                return holders.union(network_helpers, own_children())

            sampler = Sampler(config.sample_interval_ms, helper_pids)
            runner = cls(
                config, scratch_root, launcher or ProcessGroupLauncher(), sampler, isolation, live_roots,
                mount_namespaces, networks, launch_threads=launch_threads, tool_confinement=tool_confinement,
                rune=rune, cpu_groups=cpu_groups,
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
                                bound = config.kill_grace_ms / 1000 + KILL_WAIT_S + _PIPE_DRAIN_S
                                with trio.move_on_after(bound):
                                    while runner._dispatches:
                                        await trio.sleep(0.01)
                            await runner.uids.end_adopted_orphans()
                        nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(runner.scratch.close)
                    tool_confinement.close()
                    if mount_namespaces is not None:
                        await trio.to_thread.run_sync(mount_namespaces.close)
                    if networks is not None:
                        await trio.to_thread.run_sync(networks.close)
                    if host_table is not None:
                        await trio.to_thread.run_sync(hostnet.remove, host_table)

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

    def _launch(
        self,
        agent: AgentSpec,
        intent_id: str,
        argv: list[str],
        scratch: str | None,
        cpu_ms: int,
        creds: AgentCredentials | None,
        namespaces: HeldNamespaces | None,
        network: NetworkMode,
        cwd: str | None = None,
        landlock_ruleset: int = -1,
        priority: str | None = None,
    ) -> tuple[str | None, Launched | LaunchError | OSError]:
        """Make the scratch dir if none was ready, build the plan, spawn (blocking; any thread).

        ``intent_id`` is the run's marker (the intent's id for an agent, a
        unique run id for a tool); ``namespaces`` are the uid's private
        /tmp and network (:meth:`_namespaces_off_the_loop`). Returns the scratch dir with the process,
        or with the error, so the caller can give the dir back either way.
        """
        try:
            if scratch is None:
                scratch = self.scratch.make()
            if creds is not None:
                os.chown(scratch, creds.uid, creds.gid)  # its HOME and TMPDIR: 0700, the agent's own
            plan = self.plans.plan(
                agent, intent_id, argv, scratch, cpu_ms, creds, namespaces, cwd, network=network,
                spawn_on_this_cpu=self.in_flight > 0, landlock_ruleset=landlock_ruleset, priority=priority,
            )
            return scratch, self.launcher.launch(plan)
        except (LaunchError, OSError) as exc:
            return scratch, exc

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
        priority = self.plans.priority(agent, payload.get("priority"))
        base = self._record_base(agent, intent_id, started_at, priority)
        argv: list[str] = []
        wall_ms, cpu_ms = self.plans.budgets(agent)
        self._starting[intent_id] = None
        try:
            argv = self.plans.argv(agent)
            scratch, launched, creds = await self._spawn(agent, intent_id, argv, cpu_ms, agent.resources.network,
                                                         priority=priority)
        except (LaunchError, OSError) as exc:
            message = str(exc) if isinstance(exc, LaunchError) else f"cannot prepare agent {agent.id}: {exc}"
            log.warning("spawn failed", extra={"agent": agent.id, "intent": intent_id, "detail": message})
            outcome = "workflow_not_supported" if isinstance(exc, WorkflowNotSupported) else "spawn_failed"
            return DispatchRecord.without_process(
                t0=t0, **base, argv=argv, pid=None, outcome=outcome, error=message, result=None
            )
        finally:
            cancelled_while_starting = self._starting.pop(intent_id)
        base["limits"]["nice"] = launched.nice  # what it got: a daemon without CAP_SYS_NICE cannot lower it
        dispatch = RunState(agent, intent_id, launched, base["limits"], wall_ms / 1000, cpu_ms, deadline)
        if creds is not None:
            base["uid"] = creds.uid
        if cancelled_while_starting is not None:
            dispatch.decide("cancelled", cancelled_while_starting)  # before it is supervised: never released
        left = await self._run_to_end(dispatch, scratch, creds, intent_line(payload), on_spawned)
        if dispatch.hook_error is not None:
            raise dispatch.hook_error
        return build_record(dispatch, base, t0, left, self.config.stderr_tail_bytes)

    def never_started(self, agent: AgentSpec, intent_id: str, outcome: Outcome, error: str, *, t0: float) -> DispatchRecord:
        """The record of an intent whose agent never started, e.g. one cancelled while it waited for a slot
        (``t0``: :func:`time.monotonic` when it was accepted, its ``started_at``)."""
        started_at = iso_ms(now_ms() - int((time.monotonic() - t0) * 1000))
        return DispatchRecord.without_process(
            t0=t0, **self._record_base(agent, intent_id, started_at), argv=[], pid=None, outcome=outcome, error=error,
            result=None,
        )

    def _record_base(self, agent: AgentSpec, intent_id: str, started_at: str, priority: str | None = None) -> dict[str, Any]:
        return {
            "intent_id": intent_id,
            "agent_id": agent.id,
            "agent_version": agent.version,
            "runtime": agent.runtime,
            "limits": self.plans.limits(agent, priority),
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
        network: NetworkMode,
        cwd: str | None = None,
        on_started: Callable[[RunState], None] | None = None,
        files: ToolFiles | None = None,
        priority: str,
        memory_mb: int | None = None,
    ) -> ToolRun:
        """Run a process tool of ``agent`` once: ``document`` on stdin, one JSON document expected on stdout.

        The tool mode of the runner (docs/tools.md): the same launch plan as
        the agent's own processes (its environment allowlist, memory and disk
        limits, nice, network, PDEATHSIG, process group, scratch dir as
        HOME/TMPDIR, cwd the package folder), the same sampler and kill
        ladder; only the budgets differ: ``wall_ms`` of wall-clock time from
        release, and as much CPU time. ``run_id`` marks every process of the
        run (``COVENANT_INTENT_ID``) and must be unique among runs in flight.
        With ``files`` the run is confined to them, the system's files and its
        scratch dir (:attr:`tool_confinement`; ``spawn_failed`` where this host
        cannot confine it). ``priority`` is the intent's: it moves the nice of the
        agent's class (:meth:`LaunchPlans.nice <covenant.runtime.launch_plans.LaunchPlans.nice>`).
        ``memory_mb`` holds the run's tree to that resident memory instead of the agent's (its class's): a
        backend with a budget of its own, such as a browser. Never raises for a fault of the tool; on cancellation the tree is torn
        down (shielded) and Cancelled propagates.
        """
        t0 = time.monotonic()
        cpu_ms = wall_ms
        workspace = None
        if cwd is not None:  # a workspace: only its growth during the run counts, so it is measured first
            workspace = TreeScan(cwd)
            await trio.to_thread.run_sync(workspace.measure)
        try:
            scratch, launched, creds = await self._spawn(agent, run_id, list(argv), cpu_ms, network, cwd, files=files,
                                                         priority=self.plans.priority(agent, priority))
        except (LaunchError, OSError) as exc:
            message = str(exc) if isinstance(exc, LaunchError) else f"cannot prepare the tool: {exc}"
            log.warning("tool spawn failed", extra={"agent": agent.id, "intent": run_id, "detail": message})
            if workspace is not None:
                workspace.close()
            return ToolRun.spawn_failed(list(argv), message, t0)
        limits = {**self.plans.limits(agent, self.plans.priority(agent, priority)), "wall_ms": wall_ms, "cpu_ms": cpu_ms,
                  "nice": launched.nice}
        if memory_mb is not None:
            limits["memory_mb"] = memory_mb
        run = RunState(agent, run_id, launched, limits, wall_ms / 1000, cpu_ms)
        if on_started is not None:
            on_started(run)
        left = await self._run_to_end(run, scratch, creds, document, None, workspace)
        return tool_run_record(run, t0, left.bytes, self.config.stderr_tail_bytes)

    async def launch(self, plan: LaunchPlan, agent: AgentSpec, network: NetworkMode) -> Launched:
        """Launch ``plan``, a process of ``agent``, in its uid's private /tmp and its network namespace for
        ``network`` (raises LaunchError/OSError).

        For processes started outside :meth:`run` (Rune replicas, stdio MCP servers), from one of
        the runner's launch threads: PR_SET_PDEATHSIG fires when the *thread* that spawned a process
        exits, and trio's thread cache retires a worker idle for 10 s, which would kill a process
        launched from it with SIGKILL. The same holds for the private /tmp's holder, which the uid's
        first process may start here. A Rune agent's process gets its class's nice and CPU group here.
        """

        def start() -> Launched:
            held = self.plans.namespaces(agent, plan.credentials, network)
            own_netns = held is not None and bool(held.flags & _elf.CLONE_NEWNET)
            return self.launcher.launch(dataclasses.replace(
                self.plans.in_class(plan, agent), namespaces=held, isolate_network=network == "off" and not own_netns))

        return await self._launch_threads.run(start)

    async def _namespaces_off_the_loop(
        self, agent: AgentSpec, creds: AgentCredentials | None, network: NetworkMode
    ) -> HeldNamespaces | None:
        """:meth:`LaunchPlans.namespaces <covenant.runtime.launch_plans.LaunchPlans.namespaces>`, on a launch
        thread when the uid has no holder yet: starting one takes ~15-30 ms, which the loop does not wait
        through. (A holder that died is replaced on the loop.)"""
        if not self.plans.holders_ready(creds, network):
            return await self._launch_threads.run(self.plans.namespaces, agent, creds, network)
        return self.plans.namespaces(agent, creds, network)

    async def _spawn(
        self, agent: AgentSpec, marker: str, argv: list[str], cpu_ms: int, network: NetworkMode, cwd: str | None = None,
        *, files: ToolFiles | None = None, priority: str | None = None,
    ) -> tuple[str, Launched, AgentCredentials | None]:
        """Claim the agent's uid, take (or make) a scratch dir and start the process (confined to ``files``,
        at the nice of ``priority``, default the manifest's).

        On failure the uid and the dir are given back and the error is raised.
        """
        creds = await self.uids.claim(agent.id)
        scratch = self.scratch.take(creds.uid if creds is not None else os.getuid())
        made: str | None
        launched: Launched | LaunchError | OSError
        ruleset = None
        try:
            namespaces = await self._namespaces_off_the_loop(agent, creds, network)
            if files is not None:
                scratch = scratch or self.scratch.make()  # the ruleset names it: it must exist first
                ruleset = await trio.to_thread.run_sync(self.tool_confinement.acquire, files, scratch)
        except (LaunchError, OSError) as exc:
            made, launched = scratch, exc
        else:
            # On the loop even while others run: on a thread the spawn's Python shares the GIL with the
            # loop anyway, and the hand-offs cost more than the vfork wait they spare the loop (16
            # concurrent clients: 2-7 % more dispatches per s, 7-11 % less CPU; docs/performance.md).
            # Not a process of a CPU group (a Rune agent's tool): moving it there is a cgroup.procs write,
            # which now and then waits ≈ 10 ms for the kernel (docs/security.md, "CPU groups").
            launch = partial(self._launch, agent, marker, argv, scratch, cpu_ms, creds, namespaces, network,
                             cwd, ruleset.fd if ruleset is not None else -1, priority)
            try:
                grouped = self.plans.cpu_groups is not None and self.plans.resource_class(agent) is not None
                made, launched = await self._launch_threads.run(launch) if grouped else launch()
            finally:
                if ruleset is not None:
                    self.tool_confinement.release(ruleset)
        if isinstance(launched, Exception):
            with trio.CancelScope(shield=True):
                if creds is not None:
                    await self.uids.release(creds, agent.id, marker)
                if made is not None:
                    await self.scratch.give_back(made)
            raise launched
        assert made is not None
        return made, launched, creds

    async def _run_to_end(
        self, d: RunState, scratch: str, creds: AgentCredentials | None, stdin: bytes, on_spawned: SpawnHook | None,
        workspace: TreeScan | None = None,
    ) -> Removal:
        """Supervise a started run until its whole tree is gone; return what it left behind, removed.

        That is what is left in its scratch dir, plus, when it was the last
        live run of its uid, what the uid left in its temp dirs; never raises
        for what the agent made there (any depth, links, modes: the removal
        says what it could not remove, :mod:`covenant.runtime.tree_removal`).
        Its disk use (scratch dir, ``workspace``'s growth, its uid's private /tmp) is measured on the
        sampler's ticks and once more, whole, before that removal.
        """
        self._dispatches.add(d)
        if self._stopping:  # cancel_all came while this run was being spawned: its agent is never released
            d.decide("cancelled", _STOPPING)
        d.disk = self._disk_use(d.agent, scratch, creds, workspace)
        self.sampler.watch_disk(d.disk)
        self.sampler.register(d.tree, d.check_limits)
        left = Removal()
        try:
            try:
                await self._supervise(d, stdin, on_spawned)
            except BaseException:
                d.decide("cancelled", "the run was cancelled by its caller")
                raise
            finally:
                with trio.CancelScope(shield=True):
                    await self._finish(d)
                    self.sampler.unwatch_disk(d.disk)  # before the last check, which may run on a thread
                    await self._last_disk_check(d)
                    released = await self.uids.release(creds, d.agent.id, d.intent_id) if creds is not None else Released()
                    d.left_behind += released.killed
                    left = await self.scratch.give_back(scratch) + released.left
        finally:
            self.sampler.unregister(d.tree)
            self.sampler.unwatch_disk(d.disk)
            d.disk.close()
            self._dispatches.discard(d)
        return left

    def _disk_use(self, agent: AgentSpec, scratch: str, creds: AgentCredentials | None,
                  workspace: TreeScan | None) -> DiskUse:
        """What a run's ``disk_mb`` holds: its scratch dir, ``workspace``'s growth and, with agent uids that
        have one, its uid's private /tmp and /dev/shm."""
        disk_mb = agent.resources.disk_mb
        private = None
        if creds is not None and self.mount_namespaces is not None:
            private = partial(self.mount_namespaces.usage, creds.uid)
        return DiskUse(disk_mb, inodes_for(disk_mb, self.isolation.tmp_inodes), scratch, workspace=workspace,
                       private=private)

    @staticmethod
    async def _last_disk_check(d: RunState) -> None:
        """Every process of the run is gone: measure its disk use whole before what it left is removed (a run
        shorter than a tick is judged too). On the loop as far as one tick's budget goes (an empty scratch
        dir: one listing), the rest on a worker thread."""
        assert d.disk is not None
        if not d.disk.finish(ENTRIES_PER_TICK):
            await trio.to_thread.run_sync(d.disk.finish)
        d.check_disk(at_end=True)

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
            collect_root(d)
        elif d.verdict is None and d.launched.status is None:
            wall_ms = round(d.wall_s * 1000)
            if d.deadline == d.caller_deadline:
                d.decide("timeout", f"the agent did not finish before the intent that called it had to end "
                                    f"(its own wall-clock budget is {wall_ms} ms)")
            else:
                d.decide("timeout", f"the agent did not finish within its wall-clock budget of {wall_ms} ms")
        await self._ladder.terminate(d, watch.await_root)
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

    async def _finish(self, d: RunState) -> None:
        """Make sure the tree is gone and our ends are closed (also on cancellation)."""
        if d.launched.status is None or not d.swept:
            await self._ladder.terminate(d)
        d.launched.close()


def paths_agent_processes_run(config: Config) -> list[str]:
    """Paths outside agents' packages that replicas and stdio MCP servers run, for :meth:`Runner.open`'s
    ``visible``: kept visible (bound back) when an agent uid's private /tmp covers the host's."""
    paths = [config.rune.python] if config.rune.python else []
    for server in config.mcp.values():
        program = resolve_program(server.command[0], config.runtime.path)
        paths += [*([program] if program else []), *server.named_paths()]
    return paths
