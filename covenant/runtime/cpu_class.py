"""A Rune agent's class of CPU and memory, and the kernel CPU groups that hold its processes to it.

The class comes from the Runefile's ``runtime.resource_profile`` (small, medium, large) and covenant.toml's
``[rune]`` keys: ``nice_<profile>``, ``cpu_<profile>`` (cores) and ``memory_<profile>_mb``. It applies to
the agent's replica and to every process run for its tools (docs/rune-packages.md, "resource_profile").

Nice: the profile's, plus the offset of the intent's priority (:data:`PRIORITY_OFFSET`), clamped to
-20..19, set in one ``setpriority`` at the exec gate.

CPU share: the most CPU time all of an agent's processes may use together, per wall-clock second,
enforced by the kernel's CPU controller: one group per agent under a parent of the daemon's home,
``covenant_<10 hex of the home's state dir>`` (the name of its nftables table), in the daemon's own group
of the cgroup v2 hierarchy where ``cpu`` can be enabled there, else of the cgroup v1 ``cpu`` hierarchy.
The launcher moves each new process into its agent's group at the exec gate, before the agent's code runs,
by writing its pid to the group's ``cgroup.procs`` (root's file: an agent uid can neither change its
quota nor move itself out). The parent and a group are made at an agent's first launch. A group is
removed when its agent goes (a reload withdraws it, a spawned agent is killed or expires), unless a
background process of its tools still runs in it; all of them when the daemon stops; those of a daemon
that was killed are removed (their processes killed) when the next one starts.
Where no controller is writable there is no CPU share, only nice: :attr:`CpuGroups.problem` says why.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import NamedTuple

from covenant.config import RuneConfig
from covenant.runtime.hostnet import table_name

__all__ = ["CpuGroups", "PRIORITY_OFFSET", "ResourceClass", "combined_nice", "resource_class"]

log = logging.getLogger("covenant.runtime")

PRIORITY_OFFSET: dict[str, int] = {"low": 10, "normal": 0, "high": -5}
"""A run's priority -> what it adds to the nice of its agent's class (0 for an agent without one)."""

PERIOD_US = 100_000
"""The CPU controller's accounting period: an agent of ``c`` cores may run ``c × PERIOD_US`` µs in each."""

_MIN_QUOTA_US = 1000  # the kernel refuses a quota under 1 ms
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,200}")
_EMPTY_WAIT_S = 10.0
_FORGET_WAIT_S = 5.0


class ResourceClass(NamedTuple):
    """What a ``resource_profile`` gives an agent's processes."""

    profile: str
    nice: int
    cpu_cores: float
    memory_mb: int


def resource_class(rune: RuneConfig, profile: str) -> ResourceClass:
    """The class of ``profile`` under ``rune`` (covenant.toml's ``[rune]``)."""
    return ResourceClass(profile, rune.nice(profile), rune.cpu_cores(profile), rune.memory_mb(profile))


def combined_nice(base: int, priority: str) -> int:
    """``base`` (a class's nice, 0 without one) moved by ``priority``'s offset, clamped to the kernel's -20..19."""
    return max(-20, min(19, base + PRIORITY_OFFSET[priority]))


def _group_name(agent_id: str) -> str:
    """The directory name of an agent's group: its id where that is a plain name, else a digest of it."""
    if _SAFE_NAME.fullmatch(agent_id) and agent_id not in (".", ".."):
        return agent_id
    return "agent_" + hashlib.sha256(agent_id.encode()).hexdigest()[:16]


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup mount of this process's mount namespace."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fields, rest = head.split(), tail.split()
            if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                found.append((fields[4].replace("\\040", " "), rest[0], set(rest[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (``""`` for v2) -> this process's group path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def _find_controller(name: str) -> tuple[Path | None, str, str | None]:
    """(parent directory to make, ``"cgroup v2"`` or ``"cgroup v1"``, None) or (None, "", why not)."""
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as exc:
        return None, "", f"cannot read this process's cgroups: {exc}"
    reasons = []
    for point, kind, options in mounts:
        if kind != "cgroup2" or "" not in own:
            continue
        base = Path(point) / own[""].lstrip("/")
        try:
            controllers = (base / "cgroup.controllers").read_text().split()
            if "cpu" not in controllers:
                reasons.append(f"cgroup v2 at {point}: the cpu controller is not available in {base} (bound to v1?)")
                continue
            if "cpu" not in (base / "cgroup.subtree_control").read_text().split():
                _write(base / "cgroup.subtree_control", "+cpu")
            return base / name, "cgroup v2", None
        except OSError as exc:
            reasons.append(f"cgroup v2 at {point}: cannot enable cpu for the groups under {base}: {exc.strerror or exc}")
    for point, kind, options in mounts:
        if kind != "cgroup" or "cpu" not in options or "cpu" not in own:
            continue
        base = Path(point) / own["cpu"].lstrip("/")
        if not os.access(base, os.W_OK) or not (base / "cpu.cfs_quota_us").exists():
            reasons.append(f"cgroup v1 cpu at {point}: {base} is not writable here or has no cpu.cfs_quota_us")
            continue
        return base / name, "cgroup v1", None
    return None, "", "; ".join(reasons) or "no cgroup cpu controller is mounted"


class CpuGroups:
    """One CPU group per agent of one daemon's home (thread-safe: launches run on several threads)."""

    def __init__(self, parent: Path | None, version: str, problem: str | None) -> None:
        self.parent = parent
        """``…/covenant_<hash>``; None where no controller is writable."""
        self.version = version
        """``"cgroup v2"``, ``"cgroup v1"`` or ``""``."""
        self.problem = problem
        """Why agents get no CPU share here (nice only), or None."""
        self._cores: dict[str, float] = {}
        self._lock = threading.Lock()

    @classmethod
    def open(cls, home_key: str) -> "CpuGroups":
        """Find a writable CPU controller (on cgroup v2 enabling ``cpu`` for the daemon's own group's children)
        and remove what a killed daemon of this home left (blocking; call once at the daemon's start). No
        group is made before an agent's first launch. Without a controller (the shipped systemd unit's
        ``ProtectControlGroups=yes``, for one) Rune agents get nice only: logged at info, and
        ``covenant status`` says why (``cpu_share``)."""
        parent, version, problem = _find_controller(table_name(home_key))  # named like the home's nftables table
        groups = cls(parent, version, problem)
        if parent is None:
            log.info("Rune agents get no CPU share, only nice", extra={"detail": problem})
            return groups
        stale = groups._remove_all()
        if stale:
            log.warning("removed CPU groups left by an earlier run", extra={"groups": ",".join(stale)})
        return groups

    def procs_file(self, agent_id: str, cores: float) -> str | None:
        """The ``cgroup.procs`` of ``agent_id``'s group, made (or its quota changed) to ``cores``; None
        where there is no controller or the group cannot be made (logged: a spawn never fails for it)."""
        if self.parent is None:
            return None
        group = self.parent / _group_name(agent_id)
        with self._lock:
            if self._cores.get(agent_id) != cores:
                quota = max(_MIN_QUOTA_US, round(cores * PERIOD_US))
                try:
                    if not self.parent.is_dir():
                        self.parent.mkdir(mode=0o755)
                        if self.version == "cgroup v2":
                            _write(self.parent / "cgroup.subtree_control", "+cpu")
                    group.mkdir(mode=0o755, exist_ok=True)
                    if self.version == "cgroup v2":
                        _write(group / "cpu.max", f"{quota} {PERIOD_US}")
                    else:
                        _write(group / "cpu.cfs_period_us", str(PERIOD_US))
                        _write(group / "cpu.cfs_quota_us", str(quota))
                except OSError as exc:
                    log.warning("cannot set an agent's CPU group", extra={"agent": agent_id, "path": str(group),
                                                                         "detail": str(exc)})
                    return None
                self._cores[agent_id] = cores
        return str(group / "cgroup.procs")

    def forget(self, agent_id: str) -> None:
        """Remove the group of an agent that is gone (withdrawn, or a spawned one ended; blocking, up to
        :data:`_FORGET_WAIT_S` while its last processes, a spare replica being stopped, leave). A group
        something still runs in then (a background process of its tools) stays until the daemon stops."""
        if self.parent is None:
            return
        with self._lock:
            self._cores.pop(agent_id, None)  # a launch that comes now makes the group again
        group = self.parent / _group_name(agent_id)
        deadline = time.monotonic() + _FORGET_WAIT_S
        while True:
            try:
                group.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    log.info("a withdrawn agent's CPU group stays until the daemon stops",
                             extra={"agent": agent_id, "path": str(group), "detail": str(exc)})
                    return
            time.sleep(0.02)

    def close(self) -> None:
        """Remove every agent group and the parent (blocking; at the daemon's stop, its agents gone)."""
        with self._lock:
            self._remove_all()
            self._cores.clear()

    def to_json(self) -> dict[str, object]:
        return {"controller": self.version or None, "parent": str(self.parent) if self.parent else None,
                "problem": self.problem}

    def _remove_all(self) -> list[str]:
        """Remove each agent group, killing what still runs in it, then the parent; return the groups' names."""
        if self.parent is None or not self.parent.is_dir():
            return []
        removed = self._remove_groups(self.parent)
        try:
            self.parent.rmdir()
        except OSError as exc:
            log.warning("cannot remove the agents' CPU group parent", extra={"path": str(self.parent), "detail": str(exc)})
        return removed

    @staticmethod
    def _remove_groups(parent: Path) -> list[str]:
        removed = []
        for group in sorted(p for p in parent.iterdir() if p.is_dir()):
            deadline = time.monotonic() + _EMPTY_WAIT_S
            while True:
                try:
                    group.rmdir()
                    removed.append(group.name)
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.warning("cannot remove an agent's CPU group", extra={"path": str(group), "detail": str(exc)})
                        break
                # Only agents' processes are ever put in a group: what is left is a dead daemon's.
                for pid in _pids(group):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.02)
        return removed


def _pids(group: Path) -> list[int]:
    try:
        return [int(line) for line in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []
