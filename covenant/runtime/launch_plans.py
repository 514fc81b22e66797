"""Turn an agent's manifest into the :class:`~covenant.runtime.launcher.LaunchPlan` its process starts with.

Its command line by runtime, its CPU and wall-clock budgets, the limits its record shows, its
rlimits, environment and nice value, its uid's private /tmp and its network (and whether this host
gives agent uids them at all): what a run of an agent *is*.
Spawning, supervising and killing it is :mod:`covenant.runtime.runner`'s job.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import resource
import shutil
import sys
from pathlib import Path
from typing import Any

from covenant.config import RuneConfig, RuntimeConfig
from covenant.manifest.model import AgentSpec
from covenant.runtime.environment import agent_environment
from covenant.runtime.isolation import Isolation
from covenant.netpolicy import parse_host_service
from covenant.runtime import _elf, host, hostnet
from covenant.runtime.cpu_class import CpuGroups, ResourceClass, combined_nice, resource_class
from covenant.runtime.launcher import AgentCredentials, LaunchError, LaunchPlan
from covenant.runtime.mountns import DEFAULT_TMP_INODES, MountNamespaces
from covenant.runtime.netns import AgentNetworks, HeldNamespaces, NetworkMode

__all__ = ["LaunchPlans", "WorkflowNotSupported", "agent_networks", "private_tmp_namespaces", "resolve_program"]

log = logging.getLogger("covenant.runtime")

_MIB = 1024 * 1024


class WorkflowNotSupported(LaunchError):
    """A workflow agent reached the process runner (``covenant run``: workflows run only in the daemon's
    engine, :mod:`covenant.workflow`); outcome ``workflow_not_supported``."""


def resolve_program(name: str, path: str) -> str | None:
    """Absolute path of an interpreter: as given when absolute, else looked up on ``path``."""
    if os.path.isabs(name):
        return name if os.access(name, os.X_OK) and os.path.isfile(name) else None
    found = shutil.which(name, path=path)
    return os.path.abspath(found) if found else None


def private_tmp_namespaces(
    config: RuntimeConfig, scratch_root: Path, isolation: Isolation | None, visible: list[str]
) -> MountNamespaces | None:
    """Private /tmp and /dev/shm per agent uid when this host allows them (one probe namespace).

    Called once by :meth:`covenant.runtime.runner.Runner.open`, on a launch thread.
    """
    import covenant

    needed = [str(scratch_root), sys.executable, os.path.dirname(covenant.__file__), *visible]
    needed += [p for p in (resolve_program(config.python3, config.path),
                           resolve_program(config.node, config.path)) if p]
    spaces = MountNamespaces(scratch_root.parent / "isolation" / "stage", needed,
                             max_inodes=isolation.tmp_inodes if isolation is not None else DEFAULT_TMP_INODES)
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


def agent_networks(config: RuntimeConfig, isolation: Isolation) -> tuple[AgentNetworks | None, str | None]:
    """Network namespaces for agent uids when this host allows them, and egress from them when the host's
    side can be confined: returns them with the nftables table this process installed (to remove at
    close), and notes in ``isolation`` what is missing.

    Called once by :meth:`covenant.runtime.runner.Runner.open`, on a launch thread (the probe namespace's
    holder is PDEATHSIG-armed).
    """
    problem = None
    if not config.pdeathsig:
        problem = "runtime.pdeathsig = false: agents start without covenant's exec helper, which enters it"
    elif not MountNamespaces.available():
        problem = "covenant's credentialed exec helper is not available here (x86-64 only)"
    elif not host.can_enter_namespaces():
        problem = "covenant lacks CAP_SYS_ADMIN, which entering a network namespace at exec takes"
    networks = AgentNetworks(host_loopback=any(
        parse_host_service(entry)[0].is_loopback for entry in isolation.host_allow))
    if problem is None:
        try:
            networks.namespaces_for(0, 0, "off", None)  # uid 0 is never an agent's: a probe, stopped at once
        except OSError as exc:
            problem = str(exc)
    if problem is not None:
        networks.close()
        isolation.network_problem = f"no network namespace of their own for agents here: {problem}"
        log.warning("agents get no network namespace of their own", extra={"detail": isolation.network_problem})
        return None, None
    networks.release(0)
    gids, probe = isolation.agent_gids(), isolation.probe_credentials()
    assert gids is not None and probe is not None and isolation.state_dir is not None
    table = None
    problem = networks.egress_problem()
    if problem is None:
        try:
            networks.namespaces_for(0, probe.gid, "full", None)  # slirp4netns comes up here (a probe)
            table = hostnet.confine(str(isolation.state_dir.resolve()), gids, isolation.host_allow)
        except OSError as exc:
            problem = str(exc)
        else:
            problem = hostnet.check(probe.uid, probe.gid)
        networks.release(0)
    if problem is not None:
        isolation.egress_problem = problem
        log.warning("agents with network get no egress here", extra={"detail": problem})
    return networks, table


class LaunchPlans:
    """The launch plans of one runner's agent processes (:attr:`covenant.runtime.runner.Runner.plans`).

    Interpreters are resolved to absolute paths here, once, not per dispatch.
    """

    def __init__(
        self, config: RuntimeConfig, isolation: Isolation, mount_namespaces: MountNamespaces | None,
        networks: AgentNetworks | None = None, *, rune: RuneConfig | None = None, cpu_groups: CpuGroups | None = None,
    ) -> None:
        self.config = config
        self.rune = rune or RuneConfig()
        """``[rune]``: the classes of ``resource_profile``, fixed for the daemon's life (``[rune]`` changes need a restart)."""
        self.cpu_groups = cpu_groups
        """The agents' CPU groups (the daemon's); None: nice only (``covenant run``)."""
        self.isolation = isolation
        self.mount_namespaces = mount_namespaces
        self.networks = networks
        """Each agent uid's network namespaces; None where agents get none (same-uid, or the host cannot)."""
        self._interpreters = {
            "python3": (config.python3, resolve_program(config.python3, config.path)),
            "node": (config.node, resolve_program(config.node, config.path)),
        }

    def interpreter(self, runtime: str) -> str | None:
        """The absolute path of ``[runtime] python3`` or ``node`` (resolved at start), or None when missing."""
        return self._interpreters[runtime][1]

    def budgets(self, agent: AgentSpec) -> tuple[int, int]:
        """(wall ms, CPU ms): CPU = cpu_ms_per_task; wall = that plus runtime.wall_grace_ms."""
        cpu_ms = agent.resources.cpu_ms_per_task
        return cpu_ms + self.config.wall_grace_ms, cpu_ms

    @staticmethod
    def priority(agent: AgentSpec, asked: object) -> str:
        """The priority of a run of ``agent`` for an intent that ``asked`` for one (``dispatch --priority``):
        ``low`` or ``high`` as asked; for ``normal`` (the default) or nothing, the agent's own
        ``[settlement] priority``."""
        return asked if asked in ("low", "high") else agent.settlement.priority  # type: ignore[return-value]

    def resource_class(self, agent: AgentSpec) -> ResourceClass | None:
        """The class of CPU and memory of a Rune agent's ``resource_profile``; None for other agents."""
        return resource_class(self.rune, agent.resource_profile) if agent.resource_profile else None

    def nice(self, agent: AgentSpec, priority: str | None = None) -> int:
        """The nice of a process of ``agent`` at ``priority`` (default the manifest's): its class's nice (0
        without one) plus the priority's offset, clamped to -20..19 (:func:`~covenant.runtime.cpu_class.combined_nice`)."""
        found = self.resource_class(agent)
        return combined_nice(found.nice if found else 0, priority or agent.settlement.priority)

    def forget_cpu_group(self, agent_id: str) -> None:
        """Remove the CPU group of an agent that is gone (blocking: :meth:`CpuGroups.forget`); nothing without groups."""
        if self.cpu_groups is not None:
            self.cpu_groups.forget(agent_id)

    def cpu_group(self, agent: AgentSpec) -> str | None:
        """The ``cgroup.procs`` file of ``agent``'s CPU group (made now at its first use), or None: an agent
        without a class, or no writable CPU controller here."""
        found = self.resource_class(agent)
        if found is None or self.cpu_groups is None:
            return None
        return self.cpu_groups.procs_file(agent.id, found.cpu_cores)

    def limits(self, agent: AgentSpec, priority: str | None = None) -> dict[str, Any]:
        """The limits a run of ``agent`` at ``priority`` (default: the manifest's) is held to, as its record
        and its spawn hook show them (``nice`` as asked; the runner puts in what the process got).
        A Rune agent's ``memory_mb`` is its class's."""
        wall_ms, cpu_ms = self.budgets(agent)
        res = agent.resources
        priority = priority or agent.settlement.priority
        found = self.resource_class(agent)
        return {
            "cpu_ms_per_task": res.cpu_ms_per_task,
            "wall_ms": wall_ms,
            "cpu_ms": cpu_ms,
            "memory_mb": found.memory_mb if found else res.memory_mb,
            "disk_mb": res.disk_mb,
            "network": res.network,
            "priority": priority,
            "nice": self.nice(agent, priority),
            "stdout_cap_bytes": self.config.stdout_cap_bytes,
        }

    def argv(self, agent: AgentSpec) -> list[str]:
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

    def plan(
        self,
        agent: AgentSpec,
        intent_id: str,
        argv: list[str],
        scratch: str,
        cpu_ms: int,
        creds: AgentCredentials | None,
        namespaces: HeldNamespaces | None,
        cwd: str | None = None,
        *,
        network: NetworkMode,
        spawn_on_this_cpu: bool,
        landlock_ruleset: int = -1,
        priority: str | None = None,
    ) -> LaunchPlan:
        """The plan of one process of ``agent``: ``argv`` in its package folder (or ``cwd``), ``scratch`` as
        its HOME and TMPDIR, ``cpu_ms`` of CPU time, as ``creds`` in ``namespaces``.

        ``intent_id`` is the run's marker (the intent's id for an agent, a
        unique run id for a tool); ``namespaces`` are the uid's private /tmp
        and its network ``network`` (:meth:`namespaces`). Without a network
        namespace of its own, a process with ``network = "off"`` gets a fresh
        one at exec (``unshare -n``). ``landlock_ruleset`` confines a tool's
        files (:mod:`covenant.runtime.tool_confinement`). ``priority`` moves its
        nice (:meth:`nice`; default the manifest's ``[settlement] priority``). A
        Rune agent's process (a tool's) goes into its CPU group.
        """
        env = agent_environment(
            self.config, agent_id=agent.id, intent_id=intent_id, scratch=scratch, parent_env=os.environ
        )
        return LaunchPlan(
            argv=tuple(argv),
            env=env,
            cwd=cwd or str(agent.root),
            nice=self.nice(agent, priority),
            rlimits=self._rlimits(agent, cpu_ms, creds),
            cpu_group=self.cpu_group(agent),
            isolate_network=network == "off" and (namespaces is None or not namespaces.flags & _elf.CLONE_NEWNET),
            network_required=self.config.network_enforcement == "strict",
            pdeathsig=self.config.pdeathsig,
            credentials=creds,
            namespaces=namespaces,
            landlock_ruleset=landlock_ruleset,
            spawn_on_this_cpu=spawn_on_this_cpu,
        )

    def in_class(self, plan: LaunchPlan, agent: AgentSpec) -> LaunchPlan:
        """``plan`` (a replica's, a stdio MCP server's: built outside :meth:`plan`) with ``agent``'s nice and CPU
        group; unchanged for an agent without a class."""
        if agent.resource_profile is None:
            return plan
        return dataclasses.replace(plan, nice=self.nice(agent), cpu_group=self.cpu_group(agent))

    def holders_ready(self, creds: AgentCredentials | None, network: NetworkMode) -> bool:
        """Would :meth:`namespaces` start no holder (so it need not leave the loop)?"""
        if creds is None:
            return True
        mount_ready = self.mount_namespaces is None or self.mount_namespaces.held(creds.uid)
        return mount_ready and (self.networks is None or self.networks.held(creds.uid, network))

    def namespaces(self, agent: AgentSpec, creds: AgentCredentials | None, network: NetworkMode) -> HeldNamespaces | None:
        """The namespaces a process of ``agent`` with ``network`` enters: its uid's private /tmp and
        /dev/shm and its network namespace for that mode.

        None when it gets neither (same-uid; a host that allows neither). Raises LaunchError when
        ``network`` asks for egress this host cannot confine (unless ``[isolation] network = "host"``),
        OSError when a namespace cannot be made. Blocking on a uid's first use: it starts the
        holders (~15-30 ms), which die with the thread that started them (PDEATHSIG), so call this
        only from the loop's thread or a launch thread, never a trio worker. The agent's package
        folder and entry stay visible in its /tmp, with the paths given to
        :meth:`covenant.runtime.runner.Runner.open` as ``visible``.
        """
        egress = network != "off"
        if creds is None:
            if egress and self.isolation.network != "host":
                raise LaunchError(self._no_egress(agent, network, self.isolation.reason or "isolation: same-uid"))
            return None
        mount_holder = None
        if self.mount_namespaces is not None:
            needed = [str(agent.root), *([str(agent.entry)] if agent.entry else [])]
            mount_holder = self.mount_namespaces.namespace_for(creds.uid, agent.resources.disk_mb, needed)
        problem = self.isolation.network_problem or (self.isolation.egress_problem if egress else None)
        if self.networks is not None and problem is None:
            mount_ns = f"/proc/{mount_holder}/ns/mnt" if mount_holder is not None else None
            return self.networks.namespaces_for(creds.uid, creds.gid, network, mount_ns)
        if egress and self.isolation.network != "host":
            raise LaunchError(self._no_egress(agent, network, problem or "no network namespaces here"))
        return HeldNamespaces(mount_holder, _elf.CLONE_NEWNS) if mount_holder is not None else None

    @staticmethod
    def _no_egress(agent: AgentSpec, network: NetworkMode, why: str) -> str:
        return (
            f"agent {agent.id}: network = {network!r} needs a network namespace of the agent with egress "
            f"that cannot reach the host, and this host cannot give one ({why}); refusing to run it in the "
            'host\'s network. Fix that, or set [isolation] network = "host" in covenant.toml to accept it '
            "(docs/security.md)"
        )

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
