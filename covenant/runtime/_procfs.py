"""Cheap reads of /proc for the sampler and the kill ladder.

psutil would do, but its ``children(recursive=True)`` walks all of /proc on
every call (~1 ms); reading ``/proc/<pid>/task/*/children`` and one ``stat``
file per process costs tens of microseconds. These are pseudo-files served
from kernel memory, never disk, so reading them on the trio thread is fine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "ProcStat",
    "read_stat",
    "read_hwm_kib",
    "children",
    "thread_children",
    "environ_has",
    "all_pids",
    "read_real_uid",
    "CLK_TCK",
    "PAGE_KIB",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the supervisor uses."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    cpu_ticks: int
    """utime + stime + cutime + cstime: the process and its reaped children."""
    num_threads: int
    starttime: int
    """Clock ticks after boot; with the pid it names one process across pid reuse."""
    rss_kib: int


def read_stat(pid: int) -> ProcStat | None:
    """Parse ``/proc/<pid>/stat``; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may hold spaces and parentheses: the fields start after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    return ProcStat(
        pid=pid,
        state=rest[0].decode(),
        ppid=int(rest[1]),
        pgrp=int(rest[2]),
        session=int(rest[3]),
        cpu_ticks=int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14]),
        num_threads=int(rest[17]),
        starttime=int(rest[19]),
        rss_kib=int(rest[21]) * PAGE_KIB,
    )


def read_hwm_kib(pid: int) -> int:
    """``VmHWM`` (peak resident set) of a live process in KiB; 0 when unknown."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0
    at = data.find(b"\nVmHWM:")
    if at < 0:
        return 0
    return int(data[at + 7 : data.index(b"\n", at + 7)].split()[0])


def children(pid: int, num_threads: int = 0) -> list[int]:
    """Direct children of every thread of ``pid`` (empty when it is gone).

    With ``num_threads`` 1 (from its ``stat``) only the main thread's list is read: the sampler's
    usual case, one read instead of a directory listing plus one read per thread. A thread started
    since that ``stat`` was read is listed at the next sample (a child it forks stays a child of the
    thread group while the group lives).
    """
    if num_threads == 1:
        return thread_children(pid)
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def thread_children(pid: int) -> list[int]:
    """Children of the thread ``pid`` of process ``pid`` (the main thread), empty when gone.

    The kernel hands orphans to the first live thread of a subreaper, which
    is its main thread while that runs: one read instead of :func:`children`'s
    directory listing plus one read per thread.
    """
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def environ_has(pid: int, entry: bytes) -> bool:
    """Does ``pid``'s environment hold exactly ``entry`` (``NAME=value``)?"""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def all_pids() -> list[int]:
    """Every process id in this pid namespace."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def read_real_uid(pid: int) -> int | None:
    """The real uid of a live process (from ``status``: a non-dumpable process cannot hide it); None
    when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    state = data.find(b"\nState:")
    if state >= 0 and data[state + 7 : state + 10].strip().startswith(b"Z"):
        return None
    at = data.find(b"\nUid:")
    if at < 0:
        return None
    return int(data[at + 5 : data.index(b"\n", at + 5)].split()[0])
