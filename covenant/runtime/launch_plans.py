"""Turn an agent's manifest into the :class:`~covenant.runtime.launcher.LaunchPlan` its process starts with.

Its command line by runtime, its CPU and wall-clock budgets, the limits its record shows, its
rlimits, environment and nice value, and its uid's private /tmp (and whether this host gives agent
uids one at all): what a run of an agent *is*.
Spawning, supervising and killing it is :mod:`covenant.runtime.runner`'s job.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import shutil
import sys
from pathlib import Path
from typing import Any

from covenant.config import RuntimeConfig
from covenant.manifest.model import AgentSpec
from covenant.runtime.environment import agent_environment
from covenant.runtime.isolation import Isolation
from covenant.runtime.launcher import AgentCredentials, LaunchError, LaunchPlan
from covenant.runtime.mountns import DEFAULT_TMP_INODES, MountNamespaces

__all__ = ["LaunchPlans", "PRIORITY_NICE", "WorkflowNotSupported", "private_tmp_namespaces", "resolve_program"]

log = logging.getLogger("covenant.runtime")

PRIORITY_NICE: dict[str, int] = {"low": 10, "normal": 0, "high": -5}
"""Manifest ``[settlement] priority`` -> the agent's nice value."""

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


class LaunchPlans:
    """The launch plans of one runner's agent processes (:attr:`covenant.runtime.runner.Runner.plans`).

    Interpreters are resolved to absolute paths here, once, not per dispatch.
    """

    def __init__(
        self, config: RuntimeConfig, isolation: Isolation, mount_namespaces: MountNamespaces | None
    ) -> None:
        self.config = config
        self.isolation = isolation
        self.mount_namespaces = mount_namespaces
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

    def limits(self, agent: AgentSpec) -> dict[str, Any]:
        """The limits a run of ``agent`` is held to, as its record and its spawn hook show them."""
        wall_ms, cpu_ms = self.budgets(agent)
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
        mount_namespace: str | None,
        cwd: str | None = None,
        *,
        spawn_on_this_cpu: bool,
        landlock_ruleset: int = -1,
    ) -> LaunchPlan:
        """The plan of one process of ``agent``: ``argv`` in its package folder (or ``cwd``), ``scratch`` as
        its HOME and TMPDIR, ``cpu_ms`` of CPU time, as ``creds`` in ``mount_namespace``.

        ``intent_id`` is the run's marker (the intent's id for an agent, a
        unique run id for a tool); ``mount_namespace`` is the uid's private
        /tmp (:meth:`private_tmp`); ``landlock_ruleset`` confines a tool's files
        (:mod:`covenant.runtime.tool_confinement`).
        """
        env = agent_environment(
            self.config, agent_id=agent.id, intent_id=intent_id, scratch=scratch, parent_env=os.environ
        )
        return LaunchPlan(
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
            landlock_ruleset=landlock_ruleset,
            spawn_on_this_cpu=spawn_on_this_cpu,
        )

    def private_tmp(self, agent: AgentSpec, creds: AgentCredentials | None) -> str | None:
        """The mount namespace every process of ``agent`` enters: its uid's private /tmp and /dev/shm.

        None when agents share the host's. Blocking on a uid's first use: it starts the namespace's
        holder (~15 ms), which dies with the thread that started it (PDEATHSIG), so call this only
        from the loop's thread or a launch thread, never a trio worker. Raises OSError when it cannot
        be made. The agent's package folder and entry stay visible in it, with the paths given to
        :meth:`covenant.runtime.runner.Runner.open` as ``visible``.
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
