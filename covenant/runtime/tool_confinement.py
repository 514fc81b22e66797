"""Whether this host confines a tool's files, and the Landlock rulesets of tool runs, cached.

A tool run's ruleset (:mod:`covenant.runtime.tool_files`: the system's files, its
:class:`~covenant.runtime.tool_files.ToolFiles`, its scratch dir) takes ~1 ms to build: some 160 paths
opened and added one by one. The same agent's tool runs ask for the same one again and again — the
scratch dirs of a uid are reused (:mod:`covenant.runtime.scratch`) — so a built ruleset is kept,
keyed by the inode of every path it names and by the mtimes of the /etc folders it enumerated, and
handed to every run that asks for the same: a ruleset is never consumed by
``landlock_restrict_self``. A ruleset in use by a launch is closed only once that launch gave it back.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from covenant.config import RuntimeConfig
from covenant.runtime import host, landlock
from covenant.runtime.launch_plans import resolve_program
from covenant.runtime.launcher import LaunchError
from covenant.runtime.tool_files import ETC, SystemFiles, ToolFiles, system_files

__all__ = ["HeldRuleset", "ToolConfinement", "confinement_problem"]

_CAPACITY = 32
"""Rulesets kept: a few per agent that runs tools now (each pins the inodes it names, ~160)."""

_Stamp = tuple[int, int, int] | None
"""(st_dev, st_ino, st_mtime_ns) of a watched folder, None when it is missing."""
_LISTINGS = 3
"""Listings of /etc in a row while its folders keep changing, before the last one is taken as it is."""


def confinement_problem(config: RuntimeConfig, isolated: bool) -> str | None:
    """Why tool processes' files cannot be confined on this host, or None (blocking: it may test the exec helper).

    ``isolated``: agents run as uids of their own (``isolation: uid``). Landlock is applied by covenant's
    exec helper right after it switches a process to its agent's uid, so all three are needed.
    """
    if not isolated:
        return ("agents run as the daemon's own uid (isolation: same-uid); covenant confines a tool's files as it "
                "switches the tool to its agent's uid: run the daemon as root or under the shipped unit")
    if not config.pdeathsig:
        return "runtime.pdeathsig = false: tools start without covenant's exec helper, which confines their files"
    reason = landlock.unavailable_reason()
    if reason is not None:
        return reason
    if host.pdeathsig_wrapper(credentials=True) is None:
        return "covenant's exec helper cannot switch uids on this host (x86-64 only, from an executable memfd)"
    return None


def _stamp(path: str) -> _Stamp:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def _identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino): a rule names the inode, so a path made anew (a package folder replaced) is a new key."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@dataclass
class HeldRuleset:
    """A built ruleset; ``fd`` is valid until the holder gives it back (:meth:`ToolConfinement.release`)."""

    fd: int
    users: int = 0
    evicted: bool = False
    """No longer handed out: closed when its last user gives it back."""


class ToolConfinement:
    """The runner's confinement of tool files (:attr:`covenant.runtime.runner.Runner.tool_confinement`).

    Thread-safe: :meth:`acquire` runs on worker threads, :meth:`release` anywhere.
    """

    def __init__(
        self, problem: str | None, interpreters: Iterable[str] = (), *, capacity: int = _CAPACITY, etc: str = ETC
    ) -> None:
        self.problem = problem
        """Why tool files cannot be confined here (then no ruleset is ever built), or None."""
        self.abi = landlock.abi_version()
        self._interpreters = tuple(interpreters)
        self._capacity = capacity
        """Rulesets kept (0: every run builds its own, as ``bench/tool_call.py`` measures)."""
        self._etc = etc
        self._lock = threading.Lock()
        self._system: tuple[tuple[_Stamp, ...], SystemFiles] | None = None
        self._cache: OrderedDict[tuple[object, ...], HeldRuleset] = OrderedDict()

    @classmethod
    def for_host(cls, config: RuntimeConfig, isolated: bool) -> "ToolConfinement":
        """Judge this host for runs with ``[runtime] python3`` and ``node`` (blocking: see :func:`confinement_problem`)."""
        interpreters = [resolve_program(name, config.path) for name in (config.python3, config.node)]
        return cls(confinement_problem(config, isolated), [path for path in interpreters if path])

    def to_json(self) -> dict[str, object]:
        """``tool_files`` of the daemon's status document (docs/daemon.md)."""
        return {"confined_by": None if self.problem else "landlock", "landlock_abi": self.abi, "problem": self.problem}

    def where_possible(self, files: ToolFiles) -> ToolFiles | None:
        """``files`` where this host confines tool files, else None: for ``rune@shell-exec`` and
        ``rune@process-start``, which declare no capabilities and are confined by their agent's uid where
        Landlock cannot add to it (docs/security.md, "Tool files")."""
        return files if self.problem is None else None

    def acquire(self, files: ToolFiles, scratch: str) -> HeldRuleset:
        """The ruleset of a run that may see ``files`` and write ``scratch``, built or kept (blocking).

        Give it back with :meth:`release` once the launch returned. Raises LaunchError when this host
        cannot confine a tool's files, OSError when a path of ``files`` or ``scratch`` is missing.
        """
        if self.problem is not None:
            raise LaunchError(f"a tool's files cannot be confined on this host ({self.problem}); refusing to run it unconfined")
        system = self._system_files()
        key = (system[0], tuple((p, _identity(p)) for p in files.read_only),
               tuple((p, _identity(p)) for p in files.read_write), scratch, _identity(scratch))
        with self._lock:
            held = self._cache.get(key)
            if held is not None:
                self._cache.move_to_end(key)
                held.users += 1
                return held
        fd = landlock.build_ruleset((*system[1].rules, *files.rules(scratch)), self.abi)
        with self._lock:
            held = self._cache.get(key)
            if held is not None:  # another run built the same meanwhile
                os.close(fd)
            else:
                held = self._cache[key] = HeldRuleset(fd)
            held.users += 1
            while len(self._cache) > self._capacity:
                self._evict(self._cache.popitem(last=False)[1])
            return held

    def release(self, held: HeldRuleset) -> None:
        """Give back a ruleset :meth:`acquire` handed out."""
        with self._lock:
            held.users -= 1
            if held.evicted and held.users == 0:
                os.close(held.fd)

    def close(self) -> None:
        """Close every kept ruleset (those still held close when given back)."""
        with self._lock:
            while self._cache:
                self._evict(self._cache.popitem()[1])

    def _evict(self, held: HeldRuleset) -> None:
        held.evicted = True
        if held.users == 0:
            os.close(held.fd)

    def _system_files(self) -> tuple[tuple[_Stamp, ...], SystemFiles]:
        """The system rules, made again (and every kept ruleset dropped) when a watched /etc folder changed."""
        current = self._system
        if current is not None:
            stamps = tuple(_stamp(path) for path in current[1].watched)
            if stamps == current[0]:
                return current
        # Stamps first, then the listing: a change in between makes the next call list again.
        watched = current[1].watched if current is not None else ()
        for _ in range(_LISTINGS):
            stamps = tuple(_stamp(path) for path in watched)
            fresh = system_files(self._interpreters, self._etc)
            if fresh.watched == watched:
                break
            watched = fresh.watched
        with self._lock:
            self._system = (stamps, fresh)
            for key in [k for k in self._cache if k[0] != stamps]:
                self._evict(self._cache.pop(key))
        return stamps, fresh
