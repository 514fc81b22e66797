"""Signals and reaping for the kill ladder.

Every kill is checked against the process's start time so a reused pid is
never signalled. Orphans adopted by covenant (it is a child subreaper) are
reaped here; the root process is reaped by its
:class:`~covenant.runtime.launcher.Launched`.
"""

from __future__ import annotations

import os
import trio

from covenant.runtime import _procfs

__all__ = ["signal_group", "signal_processes", "child_exited", "marked_processes", "await_gone", "KILL_WAIT_S"]

KILL_WAIT_S = 10.0
"""How long SIGKILL may take (a process in uninterruptible sleep dies late)."""


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to a process group; an empty group is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_processes(members: dict[int, int], sig: int, *, signalled_group: int | None = None) -> None:
    """Send ``sig`` to each pid whose start time still matches.

    ``signalled_group``: a process group that just got ``sig`` with :func:`signal_group`; its members
    are skipped, so a process's handler for ``sig`` runs once, not twice.
    """
    for pid, start in members.items():
        stat = _procfs.read_stat(pid)
        if stat is None or stat.starttime != start or stat.state == "Z" or stat.pgrp == signalled_group:
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def group_exists(pgid: int) -> bool:
    """Is any process, a zombie included, still in process group ``pgid``?"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # members of another uid: they exist
        pass
    return True


def child_exited(pid: int) -> bool:
    """Has covenant's child ``pid`` exited (a zombie, or reaped already)? Never reaps it: while it is
    unreaped its pid, and so its process group id, cannot be reused."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def marked_processes(marker: bytes, exclude: set[int]) -> dict[int, int]:
    """Full /proc scan for processes whose environment holds ``marker`` (blocking).

    Needed only when covenant is not a child subreaper: an escaped orphan
    then reparents to init and is invisible from covenant's own children.
    """
    found: dict[int, int] = {}
    for pid in _procfs.all_pids():
        if pid in exclude or not _procfs.environ_has(pid, marker):
            continue
        stat = _procfs.read_stat(pid)
        if stat is not None:
            found[pid] = stat.starttime
    return found


async def await_gone(members: dict[int, int], timeout: float) -> dict[int, int]:
    """Wait until the processes are dead, reaping those that are covenant's children.

    Returns the ones still alive at the timeout (a process stuck in
    uninterruptible sleep can outlive SIGKILL for a while).
    """
    me = os.getpid()
    pending = dict(members)
    with trio.move_on_after(timeout):
        while pending:
            for pid, start in list(pending.items()):
                stat = _procfs.read_stat(pid)
                if stat is None or stat.starttime != start:
                    del pending[pid]
                elif stat.state == "Z":
                    if stat.ppid == me:
                        try:
                            os.waitpid(pid, os.WNOHANG)
                        except ChildProcessError:
                            pass
                    else:
                        del pending[pid]  # its own parent (or init) reaps it
            if pending:
                await trio.sleep(0.01)
    return pending
