"""Cheap reads of /proc for the sampler and the kill ladder.

psutil would do, but its ``children(recursive=True)`` walks all of /proc on
every call (~1 ms); reading ``/proc/<pid>/task/*/children`` and one ``stat``
file per process costs microseconds. These are pseudo-files served from
kernel memory, never disk, so reading them on the trio thread is fine.

Files are read with ``os.open``/``os.read`` rather than ``open()``: a
buffered file object costs about as much again as the read itself. The
sampler keeps the files of the processes it watches open
(:class:`OpenProcess`) and re-reads them with ``pread``, which costs a
fifth of opening them by path each time.
"""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = [
    "ProcStat",
    "OpenProcess",
    "read_stat",
    "own_resident_kib",
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


_GONE = (FileNotFoundError, ProcessLookupError, PermissionError)
"""What reading a /proc file of a process that has exited (or hides) raises."""


class ProcStat(NamedTuple):
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


def _read_path(path: str) -> bytes | None:
    """The whole of a /proc file; None when its process is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except _GONE:
        return None
    try:
        return _pread_all(fd)
    finally:
        os.close(fd)


def _pread_all(fd: int) -> bytes | None:
    """Re-read an open /proc file from its start; None when its process is gone."""
    try:
        data = os.pread(fd, 65536, 0)
        while len(data) % 65536 == 0 and data:  # rare: a long children or environ list
            more = os.pread(fd, 65536, len(data))
            if not more:
                break
            data += more
    except _GONE:
        return None
    return data


def _parse_stat(pid: int, data: bytes) -> ProcStat:
    # comm may hold spaces and parentheses: the fields start after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    return ProcStat(
        pid,
        rest[0].decode(),
        int(rest[1]),
        int(rest[2]),
        int(rest[3]),
        int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14]),
        int(rest[17]),
        int(rest[19]),
        int(rest[21]) * PAGE_KIB,
    )


def read_stat(pid: int) -> ProcStat | None:
    """Parse ``/proc/<pid>/stat``; None when the process is gone."""
    data = _read_path(f"/proc/{pid}/stat")
    return None if not data else _parse_stat(pid, data)


class OpenProcess:
    """The ``stat`` and main-thread ``children`` files of one process, opened once, re-read with pread.

    An open /proc file also names one process for good: once that process
    has exited, reading fails (ESRCH) even when its pid has been reused.
    At most :attr:`LIMIT` descriptors are held by all instances together;
    :meth:`open` returns None beyond that and the caller reads by path.
    """

    LIMIT = 4096
    held = 0
    """Descriptors open in all instances."""

    __slots__ = ("pid", "_stat_fd", "_children_fd")

    def __init__(self, pid: int, stat_fd: int, children_fd: int) -> None:
        self.pid = pid
        self._stat_fd = stat_fd
        self._children_fd = children_fd

    @classmethod
    def open(cls, pid: int) -> OpenProcess | None:
        """Open the files of a live process; None when it is gone or the limit is reached."""
        if cls.held + 2 > cls.LIMIT:
            return None
        try:
            stat_fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except _GONE:
            return None
        try:
            children_fd = os.open(f"/proc/{pid}/task/{pid}/children", os.O_RDONLY | os.O_CLOEXEC)
        except _GONE:
            os.close(stat_fd)
            return None
        cls.held += 2
        return cls(pid, stat_fd, children_fd)

    def stat(self) -> ProcStat | None:
        """The process's ``stat`` now; None once it has exited."""
        data = _pread_all(self._stat_fd)
        return None if not data else _parse_stat(self.pid, data)

    def children(self, num_threads: int) -> list[int]:
        """Its direct children, as :func:`children` (one pread for a one-thread process)."""
        if num_threads != 1:
            return children(self.pid, num_threads)
        data = _pread_all(self._children_fd)
        return [int(x) for x in data.split()] if data else []

    def close(self) -> None:
        if self._stat_fd >= 0:
            os.close(self._stat_fd)
            os.close(self._children_fd)
            self._stat_fd = self._children_fd = -1
            OpenProcess.held -= 2


def _status_kib(data: bytes, field: bytes) -> int:
    """A ``Name:  N kB`` line of a ``/proc/<pid>/status`` text; 0 when it has none."""
    at = data.find(b"\n" + field + b":")
    if at < 0:
        return 0
    start = at + len(field) + 2
    return int(data[start : data.index(b"\n", start)].split()[0])


def read_hwm_kib(pid: int) -> int:
    """``VmHWM`` (peak resident set) of a live process in KiB; 0 when unknown."""
    data = _read_path(f"/proc/{pid}/status")
    return _status_kib(data, b"VmHWM") if data else 0


def own_resident_kib(pid: int) -> int:
    """The resident memory ``pid`` holds of its own, in KiB: its anonymous and shared-memory pages (``RssAnon`` +
    ``RssShmem``), not the pages of the program and library files it maps (``RssFile``), the page cache every
    process mapping the same file shares. 0 when it is gone."""
    data = _read_path(f"/proc/{pid}/status")
    return _status_kib(data, b"RssAnon") + _status_kib(data, b"RssShmem") if data else 0


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
    except _GONE:
        return out
    for tid in tids:
        data = _read_path(f"/proc/{pid}/task/{tid}/children")
        if data:
            out.extend(int(x) for x in data.split())
    return out


def thread_children(pid: int) -> list[int]:
    """Children of the thread ``pid`` of process ``pid`` (the main thread), empty when gone.

    The kernel hands orphans to the first live thread of a subreaper, which
    is its main thread while that runs: one read instead of :func:`children`'s
    directory listing plus one read per thread.
    """
    data = _read_path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in data.split()] if data else []


def environ_has(pid: int, entry: bytes) -> bool:
    """Does ``pid``'s environment hold exactly ``entry`` (``NAME=value``)?"""
    data = _read_path(f"/proc/{pid}/environ")
    return data is not None and entry in data.split(b"\0")


def all_pids() -> list[int]:
    """Every process id in this pid namespace."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def read_real_uid(pid: int) -> int | None:
    """The real uid of a live process (from ``status``: a non-dumpable process cannot hide it); None
    when it is gone or a zombie."""
    data = _read_path(f"/proc/{pid}/status")
    if data is None:
        return None
    state = data.find(b"\nState:")
    if state >= 0 and data[state + 7 : state + 10].strip().startswith(b"Z"):
        return None
    at = data.find(b"\nUid:")
    if at < 0:
        return None
    return int(data[at + 5 : data.index(b"\n", at + 5)].split()[0])
