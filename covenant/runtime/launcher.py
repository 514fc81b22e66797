"""How an agent process is started: the spawn seam.

A :class:`Launcher` turns a :class:`LaunchPlan` (argv, environment, limits)
into a running :class:`Launched` process. Today's implementation,
:class:`ProcessGroupLauncher`, starts a plain process in its own session;
a cgroup or sandbox launcher can take its place later without the runner
changing (the way httpx swaps transports).
"""

from __future__ import annotations

import abc
import errno
import logging
import os
import resource
import signal
import subprocess
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import NamedTuple

import trio

from covenant.runtime import _elf, host, teardown
from covenant.runtime.netns import HeldNamespaces
from covenant.runtime.workers import on_a_lasting_thread

__all__ = [
    "AgentCredentials",
    "LaunchPlan",
    "Launched",
    "LaunchError",
    "Launcher",
    "ProcessGroupLauncher",
    "ExitStatus",
]

log = logging.getLogger("covenant.runtime")


class LaunchError(Exception):
    """The agent could not be started; the message is for the operator."""


class AgentCredentials(NamedTuple):
    """The unprivileged uid and gid an agent process runs as (no supplementary groups)."""

    uid: int
    gid: int


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one agent process, decided before the spawn."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    nice: int = 0
    rlimits: dict[int, tuple[int, int]] = field(default_factory=dict)
    """``resource.RLIMIT_*`` -> (soft, hard), applied to the new process."""
    isolate_network: bool = False
    """Start the process in a fresh network namespace (``network = "off"``)."""
    network_required: bool = True
    """When isolation is asked for but impossible: refuse (True) or run unenforced."""
    pdeathsig: bool = True
    """Have the kernel SIGKILL the agent when covenant dies."""
    credentials: AgentCredentials | None = None
    """Run as this uid/gid, with no supplementary groups and no new privileges; None = covenant's own
    uid (``isolation: same-uid``). Decided by :mod:`covenant.runtime.isolation`; never uid or gid 0."""
    namespaces: HeldNamespaces | None = None
    """Namespaces of a holder process to run in: the agent uid's private /tmp and /dev/shm
    (:mod:`covenant.runtime.mountns`) and its network (:mod:`covenant.runtime.netns`). Needs
    ``credentials`` and covenant's exec helper."""
    landlock_ruleset: int = -1
    """A Landlock ruleset fd (the caller's, open until :meth:`Launcher.launch` returns) the exec helper
    enforces on the process after its switch to ``credentials``: what a tool may read and write
    (:mod:`covenant.runtime.landlock`). -1 = none. Needs ``credentials`` and covenant's exec helper."""
    cpu_group: str | None = None
    """The ``cgroup.procs`` file of the agent's CPU group (:mod:`covenant.runtime.cpu_class`): the process is
    moved there with its rlimits and nice, before its own code runs where the exec helper holds it at its gate."""
    spawn_on_this_cpu: bool = False
    """Start the process on the spawning thread's CPU (see :func:`_pin_to_this_cpu`): worth it while
    other runs keep the other CPUs busy; on an idle box the kernel's choice is the better one."""


@dataclass(frozen=True)
class ExitStatus:
    """How the root process ended, with the kernel's accounting for it."""

    exit_code: int | None
    signal: int | None
    cpu_ms: int
    """user + system time of the process and every child it reaped."""


class Launched:
    """A started agent: its pipes as trio streams, and a wait that reaps it.

    We wait on a pidfd and reap with ``wait4`` ourselves (instead of
    ``trio.Process``) to get the kernel's final CPU figure, which a sampler
    misses for short runs, and to signal the group before the pid is freed.
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        fds: tuple[int, int, int],
        argv: list[str],
        network_enforced: bool,
        gated: bool = False,
        credentials: AgentCredentials | None = None,
        nice: int = 0,
    ) -> None:
        self.pid = popen.pid
        self.nice = nice
        """The nice value the process started with (its plan's, or the daemon's own where that was refused)."""
        self.credentials = credentials
        """The uid/gid the agent runs as; None when it runs as covenant's own uid."""
        self.argv = argv
        self.network_enforced = network_enforced
        self.gated = gated
        """The process waits for :data:`~covenant.runtime.pdeathsig.GATE_BYTE` on stdin before exec."""
        self._popen = popen  # kept so subprocess's own cleanup never reaps behind our back
        self._pidfd = os.pidfd_open(popen.pid)
        self.stdin = trio.lowlevel.FdStream(fds[0])
        self.stdout = trio.lowlevel.FdStream(fds[1])
        self.stderr = trio.lowlevel.FdStream(fds[2])
        self.status: ExitStatus | None = None
        self._exited = trio.Event()
        self._pidfd_waiter = False

    @property
    def pidfd(self) -> int:
        """The root's pidfd (readable once it has exited); -1 after :meth:`close`."""
        return self._pidfd

    async def wait_exit(self) -> None:
        """Wait until the root process has exited, without reaping it.

        While it is an unreaped zombie its pid (and so its process group id)
        cannot be reused, which makes a last ``killpg`` safe. Several tasks
        may wait: one waits on the pidfd, the others on its event (and poll,
        in case that one is cancelled first).
        """
        if self.status is not None or self._exited.is_set():
            return
        if self._pidfd_waiter:
            while not self.exited_now():
                with trio.move_on_after(0.01):
                    await self._exited.wait()
            return
        self._pidfd_waiter = True
        try:
            await trio.lowlevel.wait_readable(self._pidfd)
            self._exited.set()
        finally:
            self._pidfd_waiter = False

    def exited_now(self) -> bool:
        """Has the root process exited (reaped or not)? Never blocks."""
        return self.status is not None or teardown.child_exited(self.pid)

    def reap(self) -> ExitStatus:
        """Collect the exited root process (idempotent); call after it exited."""
        if self.status is None:
            self.status = self._reap()
        return self.status

    def _reap(self) -> ExitStatus:
        try:
            _, raw, usage = os.wait4(self.pid, 0)
        except ChildProcessError:
            # Someone else reaped it; the figures are lost, the process is gone.
            self._popen.returncode = -1
            return ExitStatus(exit_code=None, signal=None, cpu_ms=0)
        self._popen.returncode = os.waitstatus_to_exitcode(raw)
        code = os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else None
        sig = os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else None
        cpu_ms = int((usage.ru_utime + usage.ru_stime) * 1000)
        # ru_maxrss is not used: with vfork it inherits the parent's high-water mark.
        return ExitStatus(exit_code=code, signal=sig, cpu_ms=cpu_ms)

    async def stop(self, grace_s: float) -> None:
        """Stop a long-lived child's process group: SIGTERM, ``grace_s`` to exit, then SIGKILL; reap and close it.

        For the daemon's own long-lived children (Rune replicas, stdio MCP servers); one-shot agents go
        through the runner's kill ladder instead.
        """
        if not self.exited_now():
            teardown.signal_group(self.pid, signal.SIGTERM)
            with trio.move_on_after(grace_s):
                await self.wait_exit()
        teardown.signal_group(self.pid, signal.SIGKILL)
        with trio.move_on_after(10):
            await self.wait_exit()
        if self.exited_now():
            await trio.to_thread.run_sync(self.reap)
        self.close()

    def close(self) -> None:
        """Close our pipe ends and the pidfd (the process itself is not touched).

        Synchronous, like the pipes' own ``close``: a task waiting on one is woken with
        ClosedResourceError, and no scheduler pass is spent per pipe as ``aclose`` would.
        """
        for stream in (self.stdin, self.stdout, self.stderr):
            stream.close()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


def _rlimit_setter(rlimits: dict[int, tuple[int, int]]) -> Callable[[], None]:
    def apply() -> None:
        for which, limits in rlimits.items():
            resource.setrlimit(which, limits)

    return apply


class Launcher(abc.ABC):
    """Starts agent processes. Implementations decide the isolation mechanism."""

    @abc.abstractmethod
    def launch(self, plan: LaunchPlan) -> Launched:
        """Start the process described by ``plan``; raise :class:`LaunchError` if it cannot run."""


def _pin_to_this_cpu() -> set[int] | None:
    """Pin the calling thread to the CPU it is on; return the CPUs it had (to give back), or None.

    CPython spawns with vfork(2): the spawning thread sleeps until the child has exec'd. Left to
    itself, the kernel may start the child on another CPU, busy with an agent, and the spawning
    thread (the daemon's event loop) then waits for the child's turn there. Pinned, the child runs
    on the CPU its parent leaves free at once. At 16 concurrent dispatches on two cores the loop
    spent 14 % of its time in that wait (docs/performance.md, fifth round). The child inherits the
    pin; the launcher gives it the thread's CPUs back while the helper holds it at its gate.
    When nothing else runs there is no such wait to save, and the exec is better left to an idle
    CPU than run on the loop's, whose caches it would evict.
    """
    try:
        cpus = os.sched_getaffinity(0)  # read each time: an operator may `taskset` covenant while it runs
        cpu = host.current_cpu()
        if len(cpus) < 2 or cpu not in cpus:
            return None
        os.sched_setaffinity(0, (cpu,))
    except OSError:  # a seccomp filter or an exotic kernel: spawn as before
        return None
    return cpus


def _set_cpus(pid: int, cpus: set[int]) -> None:
    """``sched_setaffinity(pid, cpus)``; a child that is already gone is no error."""
    try:
        os.sched_setaffinity(pid, cpus)
    except ProcessLookupError:
        pass
    except OSError as exc:  # not expected: a thread of ours, or our own child still running as our uid
        log.warning("cannot restore the CPU affinity of %s: %s", pid or "the spawning thread", exc,
                    extra={"pid": pid, "detail": str(exc)})


class ProcessGroupLauncher(Launcher):
    """A plain process in a new session (its own process group).

    Spawn cost matters (every dispatch pays it), so nothing runs between
    fork and exec: ``start_new_session`` keeps CPython on its vfork path,
    rlimits and nice are applied from the parent with ``prlimit(2)`` and
    ``setpriority(2)`` right after the spawn returns (before the agent's own
    code runs when the PDEATHSIG helper holds it at its gate), and exec wrappers are
    added only for what cannot be done from outside: the PDEATHSIG wrapper
    (:func:`~covenant.runtime.host.pdeathsig_wrapper`, which also switches to
    the plan's credentials) and, for ``network = "off"``, ``unshare -n``
    (run before the switch, as root). Safe to call from any thread that
    outlives the agent (PDEATHSIG is tied to the spawning thread).
    """

    def launch(self, plan: LaunchPlan) -> Launched:
        if plan.pdeathsig and not on_a_lasting_thread():
            raise RuntimeError(
                "a PDEATHSIG process spawned from a passing thread dies when that thread exits: "
                "spawn on the loop's thread or through Runner.launch"
            )
        creds = plan.credentials
        if creds is not None and (creds.uid <= 0 or creds.gid <= 0):
            raise LaunchError(f"refusing to run an agent as uid {creds.uid} / gid {creds.gid}: never root")
        netns: tuple[str, ...] = ()
        helper: tuple[str, ...] = ()
        network_enforced = False
        gated = False
        # Who switches uid/gid: covenant's credentialed helper (no fork cost) or,
        # without it, CPython in the child (Popen user=..., a full fork).
        switch_in_helper = False
        if plan.isolate_network:
            netns = host.netns_wrapper() or ()
            if netns:
                network_enforced = True
            elif plan.network_required:
                raise LaunchError(
                    'network = "off" but this host cannot create a network namespace '
                    "(unshare -n failed); refusing to run unconfined. Run covenant as root or "
                    "allow unprivileged user namespaces, or set runtime.network_enforcement = "
                    '"advisory" in covenant.toml to accept an unenforced network limit.'
                )
        if plan.pdeathsig:
            wrapper = host.pdeathsig_wrapper(credentials=True) if creds is not None else None
            if wrapper is None:
                wrapper = host.pdeathsig_wrapper()
            if wrapper is not None:
                helper = wrapper.argv
                gated = wrapper.gated
                switch_in_helper = wrapper.switches_credentials
        if plan.namespaces is not None and plan.namespaces.flags & _elf.CLONE_NEWNET:
            network_enforced = True  # the agent's own network namespace, entered at exec
        in_user_namespace = host.NETNS_IN_USER_NAMESPACE in netns
        unshare_switches = creds is not None and not switch_in_helper and bool(netns) and not in_user_namespace
        if in_user_namespace:
            # A process in a new user namespace cannot exec covenant's helper (a memfd reached
            # through /proc/<covenant>/fd: EACCES), so the helper goes first and execs `unshare -U -n`;
            # PDEATHSIG survives that (the new namespace is owned by the same uid).
            argv = [*helper, *netns, *plan.argv]
        elif unshare_switches:
            # Without covenant's helper, CPython would switch the child to the agent's uid before it
            # execs `unshare -n`, which needs root: unshare switches once the namespace is made
            # (its --setgid drops the supplementary groups), and a PDEATHSIG wrapper comes after.
            assert creds is not None
            argv = [*netns, f"--setgid={creds.gid}", f"--setuid={creds.uid}", "--", *helper, *plan.argv]
        else:
            # `unshare -n` needs CAP_SYS_ADMIN: before the helper's switch to the agent's uid.
            argv = [*netns, *helper, *plan.argv]
        # Our own pipes (O_CLOEXEC): the parent ends go straight to trio streams.
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        switch_in_popen: dict[str, object] = {}
        ns_fd = -1
        try:
            if plan.namespaces is not None:
                if not switch_in_helper:
                    raise LaunchError(
                        "an agent's private /tmp and network namespace need covenant's exec helper (x86-64, "
                        "runtime.pdeathsig = true); refusing to run the agent without them"
                    )
                ns_fd = os.pidfd_open(plan.namespaces.holder)
            if plan.landlock_ruleset >= 0 and not (creds is not None and switch_in_helper):
                raise LaunchError(
                    "confining a tool's files (Landlock) needs covenant's exec helper and an agent uid "
                    "(x86-64, isolation: uid, runtime.pdeathsig = true); refusing to run it unconfined"
                )
            credentials_block = b""
            if creds is not None:
                if switch_in_helper:
                    credentials_block = _elf.credentials_block(
                        creds.uid, creds.gid, ns_fd, plan.cwd, landlock_fd=plan.landlock_ruleset,
                        setns_flags=plan.namespaces.flags if plan.namespaces is not None else _elf.CLONE_NEWNS)
                elif unshare_switches:
                    # Still root in the child until unshare switches: the limits are lowered first.
                    switch_in_popen = {"preexec_fn": _rlimit_setter(plan.rlimits)}
                else:
                    # CPython switches in the child (a full fork); the rlimits are set there too,
                    # after the switch: lowering one's own needs no privilege, prlimit(2) on
                    # another uid's process needs CAP_SYS_RESOURCE.
                    switch_in_popen = {
                        "user": creds.uid,
                        "group": creds.gid,
                        "extra_groups": [],
                        "preexec_fn": _rlimit_setter(plan.rlimits),
                    }
        except (LaunchError, OSError) as exc:
            for fd in (in_r, in_w, out_r, out_w, err_r, err_w, ns_fd):
                if fd >= 0:
                    os.close(fd)
            if isinstance(exc, LaunchError):
                raise
            raise LaunchError(f"cannot enter the agent's namespaces (holder {plan.namespaces}): {exc}") from None
        # Only where the helper holds the agent at its gate until the CPUs are given back, and
        # CPython spawns with vfork (no preexec_fn).
        own_cpus = _pin_to_this_cpu() if plan.spawn_on_this_cpu and gated and not switch_in_popen else None
        try:
            popen = subprocess.Popen(
                argv,
                stdin=in_r,
                stdout=out_w,
                stderr=err_w,
                cwd=plan.cwd,
                env=plan.env,
                close_fds=True,
                start_new_session=True,
                pass_fds=tuple(fd for fd in (ns_fd, plan.landlock_ruleset) if fd >= 0),
                **switch_in_popen,  # type: ignore[arg-type]
            )
        except OSError as exc:
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            raise LaunchError(f"cannot execute {argv[0]}: {exc.strerror or exc}") from None
        finally:
            if own_cpus is not None:
                _set_cpus(0, own_cpus)
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            if ns_fd >= 0:
                os.close(ns_fd)
        if own_cpus is not None:
            _set_cpus(popen.pid, own_cpus)  # before the release: the agent gets what its supervisor has
        # The helper is still covenant's uid here, blocked reading its credentials block (and
        # after that at its gate, still covenant's uid): rlimits go on now, while covenant may still
        # change them without CAP_SYS_RESOURCE (a process of another uid it may not touch).
        nice = self._apply_limits(popen.pid, plan, rlimits=not switch_in_popen)
        if credentials_block:
            os.write(in_w, credentials_block)  # pipe capacity is far above its size
        return Launched(popen, (in_w, out_r, err_r), argv, network_enforced, gated, creds, nice)

    @staticmethod
    def _apply_limits(pid: int, plan: LaunchPlan, *, rlimits: bool = True) -> int:
        """Set the plan's rlimits, CPU group and nice on ``pid``; return the nice it has: the plan's, or the
        daemon's own for nice 0 or where lowering it was refused. A CPU group that cannot be entered is logged,
        never a failed spawn."""
        if plan.cpu_group is not None:
            try:
                with open(plan.cpu_group, "w", encoding="ascii") as procs:
                    procs.write(str(pid))
            except OSError as exc:
                log.warning("cannot move an agent process into its CPU group", extra={
                    "pid": pid, "path": plan.cpu_group, "detail": str(exc)})
        for which, limits in plan.rlimits.items() if rlimits else ():
            try:
                resource.prlimit(pid, which, limits)
            except ProcessLookupError:
                return plan.nice
            except (OSError, ValueError) as exc:
                log.warning("cannot set rlimit %s on %s: %s", which, pid, exc, extra={"pid": pid, "rlimit": which, "detail": str(exc)})
        own = os.getpriority(os.PRIO_PROCESS, 0)  # a new process starts with its spawning thread's
        if not plan.nice or plan.nice == own:
            return own  # nice 0 ("normal") keeps the daemon's own, as an operator's Nice= for the service means
        try:
            os.setpriority(os.PRIO_PROCESS, pid, plan.nice)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.ESRCH):
                raise
            # Raising priority (a nice below the daemon's) needs CAP_SYS_NICE: an
            # unprivileged daemon runs high-priority agents at its own nice.
            log.debug("cannot set nice", extra={"pid": pid, "nice": plan.nice, "detail": str(exc)})
            return own
        return plan.nice
