"""What this host can do for isolation, asked once and remembered.

``set_child_subreaper`` is called by the daemon (and ``covenant run``) at
start: orphaned descendants of agents then reparent to covenant instead of
init, so the sampler still sees them and the kill ladder can reach them.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
from typing import NamedTuple

from covenant.runtime import _elf, pdeathsig

__all__ = [
    "set_child_subreaper",
    "is_child_subreaper",
    "network_isolation_available",
    "can_enter_namespaces",
    "netns_wrapper",
    "pdeathsig_wrapper",
    "can_switch_uid",
    "current_cpu",
    "ExecWrapper",
]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def set_child_subreaper(enable: bool = True) -> None:
    """Mark this process PR_SET_CHILD_SUBREAPER (Linux ≥ 3.4); raise OSError on failure."""
    if _libc().prctl(_PR_SET_CHILD_SUBREAPER, int(enable), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}")


def current_cpu() -> int:
    """The CPU the calling thread runs on right now (sched_getcpu(3), through the vDSO); -1 if unknown."""
    try:
        return int(_libc().sched_getcpu())
    except AttributeError:  # a libc without it
        return -1


def is_child_subreaper() -> bool:
    """Is this process currently a child subreaper?"""
    value = ctypes.c_int(0)
    if _libc().prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) != 0:
        return False
    return bool(value.value)


_CAP_KILL, _CAP_SETGID, _CAP_SETUID, _CAP_SYS_ADMIN = 5, 6, 7, 21


def _holds(*bits: int) -> bool:
    """Does this process hold every capability ``bits`` names in its effective set? Read for root too:
    root in a container often lacks some (Docker's default set has no CAP_SYS_ADMIN)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"CapEff:"):
                    caps = int(line.split()[1], 16)
                    return all(caps >> bit & 1 for bit in bits)
    except OSError:
        pass
    return os.geteuid() == 0


def can_switch_uid() -> bool:
    """Root, or holding CAP_SETUID, CAP_SETGID and CAP_KILL (a systemd unit with those capabilities)."""
    return _holds(_CAP_KILL, _CAP_SETGID, _CAP_SETUID)


def can_enter_namespaces() -> bool:
    """Root, or holding CAP_SYS_ADMIN: what entering an agent's network namespace at exec takes
    (``setns`` checks it in the caller's own user namespace, whoever owns the namespace)."""
    return _holds(_CAP_SYS_ADMIN)


def _works(argv: list[str], stdin: bytes = b"") -> bool:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=10, env={})
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


NETNS_IN_USER_NAMESPACE = "-U"
"""In a :func:`netns_wrapper` prefix: the network namespace comes with a user namespace of its own."""


@functools.cache
def netns_wrapper() -> tuple[str, ...] | None:
    """argv prefix that runs a command in a fresh network namespace, or None.

    ``unshare -n`` needs CAP_SYS_ADMIN (a root daemon); an unprivileged daemon
    can still get one inside a new user namespace (``unshare -U -n``) where the
    kernel allows it. The first prefix that actually works here is kept.
    """
    unshare = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")
    true = shutil.which("true", path="/usr/bin:/bin")
    if unshare is None or true is None:
        return None
    for prefix in ((unshare, "-n"), (unshare, NETNS_IN_USER_NAMESPACE, "-n")):
        if _works([*prefix, true]):
            return prefix
    return None


def network_isolation_available() -> bool:
    """Can this host start a process in a new network namespace? (cached)"""
    return netns_wrapper() is not None


class ExecWrapper(NamedTuple):
    """An argv prefix that execs the agent in place after preparing it."""

    argv: tuple[str, ...]
    gated: bool
    """It waits for :data:`~covenant.runtime.pdeathsig.GATE_BYTE` on stdin before exec."""
    switches_credentials: bool = False
    """It first reads uid and gid (8 bytes) from stdin and becomes them (a root supervisor)."""


_PROBE_UID = 65534
"""``nobody``: the uid a credentialed helper is tried with (the uid need not exist)."""


def pdeathsig_wrapper(*, credentials: bool = False) -> ExecWrapper | None:
    """A wrapper setting PR_SET_PDEATHSIG=SIGKILL before exec, or None (cached per process).

    Preferred: covenant's own static helper (:mod:`covenant.runtime.pdeathsig`,
    ~0.1 ms per spawn, gated); else ``setpriv --pdeathsig KILL`` (util-linux,
    ~1.2 ms, not gated).
    Both exec the agent in place, so the agent keeps the pid covenant spawned.
    The helper is bound to the pid of the process that built it, hence the
    cache key (a forked child builds its own).

    ``credentials=True`` asks for the helper that also switches uid and gid
    (only covenant's own helper does; None elsewhere, and the launcher then
    switches through ``Popen(user=...)``).
    """
    if credentials:
        return _credentialed_wrapper(os.getpid())
    return _pdeathsig_wrapper(os.getpid())


@functools.cache
def _credentialed_wrapper(pid: int) -> ExecWrapper | None:
    true = shutil.which("true", path="/usr/bin:/bin")
    helper = pdeathsig.install_helper(credentials=True)
    if true is None or helper is None or not can_switch_uid():
        return None
    probe = _elf.credentials_block(_PROBE_UID, _PROBE_UID) + pdeathsig.GATE_BYTE
    return ExecWrapper((helper,), gated=True, switches_credentials=True) if _works([helper, true], probe) else None


@functools.cache
def _pdeathsig_wrapper(pid: int) -> ExecWrapper | None:
    true = shutil.which("true", path="/usr/bin:/bin")
    if true is None:
        return None
    helper = pdeathsig.install_helper()
    if helper is not None and _works([helper, true], stdin=pdeathsig.GATE_BYTE):
        return ExecWrapper((helper,), gated=True)
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if setpriv is None:
        return None
    prefix = (setpriv, "--pdeathsig", "KILL", "--")
    return ExecWrapper(prefix, gated=False) if _works([*prefix, true]) else None
