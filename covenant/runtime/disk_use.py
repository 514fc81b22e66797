"""What a run holds on disk while it runs: its scratch dir, its workspace's growth, its private /tmp.

``disk_mb`` is the dispatch's whole use, not one file's (RLIMIT_FSIZE is only the backstop for one
file). The sampler measures it on its tick, for every run at once, within a fixed budget of
directory entries per tick, so a tree of a million files costs a tick no more than one of a thousand:

- a tree the agent writes (its scratch dir, HOME and TMPDIR; a tool's workspace) is walked by a
  :class:`TreeScan` that resumes where the last tick stopped. It never follows a link, never leaves
  the tree's filesystem, and measures any depth with at most :data:`OPEN_LEVELS` directories open.
  What it cannot measure it does not guess: a directory covenant may not list (an agent of a
  same-uid daemon took its own read permission away) ends the run — fail closed;
- an agent uid's private /tmp and /dev/shm (:mod:`covenant.runtime.mountns`) are tmpfs instances
  capped at ``disk_mb`` by the kernel; their use is two ``statvfs`` calls. Their bytes count in the
  total each tick; one found full when the run ends makes it ``disk_exceeded`` (a write there failed).

A workspace lives on between runs, so only its growth since the run started counts: it is measured
whole (off the loop) before the run's process starts. Every figure is also taken once more, whole,
when the run's processes are gone and before what they left is removed, so a run too short for a
tick is judged as well.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["ENTRIES_PER_TICK", "MIN_ENTRIES_PER_RUN", "OPEN_LEVELS", "DiskUse", "PrivateUse", "TreeScan"]

OPEN_LEVELS = 16
"""Directory levels a scan holds open (two descriptors each: its own and its listing's); the levels
above them are let go and found again on the way back up."""
ENTRIES_PER_TICK = 512
"""Directory entries all runs' scans read together in one sampler tick (~1 ms on the loop at most)."""
MIN_ENTRIES_PER_RUN = 32
"""Each run's share of a tick when many run at once: every scan moves on each tick."""
_MIB = 1024 * 1024
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Level:
    """One directory of a scan: its identity, and while it is held open its descriptor and listing."""

    __slots__ = ("entries", "fd", "key", "name", "resume_after")

    def __init__(self, fd: int, name: str | None, st: os.stat_result) -> None:
        self.fd = fd
        self.name = name
        """Its name in its parent; None for the top."""
        self.key = (st.st_dev, st.st_ino)
        self.entries: Iterator[os.DirEntry[str]] = os.scandir(fd)
        self.resume_after: str | None = None
        """Listed again after it was let go: the entries up to this name were read before."""

    @property
    def held(self) -> bool:
        return self.fd >= 0

    def let_go(self) -> None:
        """Close it while a deeper level is walked; it is found again through ``..`` (:meth:`TreeScan._regain`)."""
        self.entries.close()  # type: ignore[attr-defined]
        os.close(self.fd)
        self.fd = -1

    def close(self, *, keep_fd: bool = False) -> None:
        if self.fd >= 0:
            self.entries.close()  # type: ignore[attr-defined]
            if not keep_fd:
                os.close(self.fd)
        self.fd = -1


class TreeScan:
    """A resumable, bounded measurement of one directory tree: the apparent size of its regular files
    (as RLIMIT_FSIZE counts them; a file with several links once) and its number of entries.

    :meth:`step` reads at most ``budget`` entries and returns how many it read. ``bytes`` and
    ``entries`` are the larger of the last complete pass and the pass under way; ``problem`` names
    what could not be measured. Any depth, with at most :data:`OPEN_LEVELS` directories open: the
    ancestors above them are let go and found again through ``..`` (checked to be the same directory)
    on the way back up. Blocking but cheap; :meth:`close` releases the descriptors.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.passes = 0
        """Complete passes so far."""
        self.problem: str | None = None
        self._done = (0, 0)
        """(bytes, entries) of the last complete pass (or the most an abandoned pass had seen)."""
        self._bytes = 0
        self._entries = 0
        self._linked: set[tuple[int, int]] = set()
        self._top: int | None = None
        self._device = 0
        self._stack: list[_Level] = []
        self._closed = False
        self._measuring: int | None = None
        """:meth:`measure` under way: the passes completed when it began."""

    @property
    def bytes(self) -> int:
        return max(self._done[0], self._bytes)

    @property
    def entries(self) -> int:
        return max(self._done[1], self._entries)

    def step(self, budget: int) -> int:
        """Go on with the pass under way (or start one) for at most ``budget`` entries; at most one pass
        ends per call. Returns the entries read (each directory opened counts as one more)."""
        if self._closed or self.problem is not None:
            return 0
        if not self._stack and not self._start_pass():
            return 0
        used = 0
        while used < budget and self._stack:
            level = self._stack[-1]
            try:
                entry = next(level.entries, None)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    self._fail(f"{self._where(None)}: cannot list it ({exc.strerror})")
                    return used
                entry = None
            used += 1
            if entry is None:
                self._leave(level)
            elif level.resume_after is not None:
                if entry.name == level.resume_after:
                    level.resume_after = None  # read before it was let go, up to here
            else:
                self._entries += 1
                self._count(level, entry)
        return used

    def restart(self) -> None:
        """Drop the pass under way: the next :meth:`step` starts a fresh one."""
        self._unwind()
        self._bytes, self._entries = 0, 0

    def measure(self, enough: Callable[[], bool] = lambda: False, budget: int | None = None) -> bool:
        """A fresh pass to its end (time linear in the tree), or until ``enough()`` says the answer is known
        already. With ``budget``, at most about that many entries: False when the pass is not over yet, and
        the next call goes on with it. Blocking."""
        if self._measuring is None:
            self.restart()
            self._measuring = self.passes
        left = budget
        while self.passes == self._measuring and self.problem is None and not self._closed and not enough():
            chunk = ENTRIES_PER_TICK if left is None else min(left, ENTRIES_PER_TICK)
            if chunk <= 0:
                return False
            used = self.step(chunk)
            if not used and not self._stack:
                break  # not there (not made, or removed): nothing to measure
            if left is not None:
                left -= used
        self._measuring = None
        return True

    def _start_pass(self) -> bool:
        try:
            if self._top is None:
                self._top = os.open(self.path, _OPEN_DIR)
            st = os.fstat(self._top)
            self._device = st.st_dev
            self._stack.append(_Level(self._top, None, st))
        except FileNotFoundError:
            return False  # not made yet, or removed: nothing held
        except OSError as exc:
            self._fail(f"cannot open it ({exc.strerror})")
            return False
        self._bytes, self._entries = 0, 0
        self._linked.clear()
        return True

    def _leave(self, level: _Level) -> None:
        """``level`` is listed to its end: back up to its parent (found again if it was let go)."""
        self._stack.pop()
        if self._stack and not self._stack[-1].held and not self._regain(self._stack[-1], level):
            level.close()
            self._abandon()
            return
        level.close(keep_fd=not self._stack)
        if not self._stack:
            self._done = (self._bytes, self._entries)
            self._bytes, self._entries = 0, 0
            self.passes += 1

    def _regain(self, parent: _Level, child: _Level) -> bool:
        """Open ``parent`` again as ``child``'s ``..``; False when that is no longer the same directory (the
        agent moved it meanwhile)."""
        try:
            fd = os.open("..", _OPEN_DIR, dir_fd=child.fd)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != parent.key:
                os.close(fd)
                return False
            parent.fd = fd
            parent.entries = os.scandir(fd)
        except OSError:
            os.close(fd)
            parent.fd = -1
            return False
        parent.resume_after = child.name
        return True

    def _abandon(self) -> None:
        """The tree moved under the scan: keep the most it had seen, start again on the next step."""
        self._done = (max(self._done[0], self._bytes), max(self._done[1], self._entries))
        self.restart()

    def _count(self, level: _Level, entry: os.DirEntry[str]) -> None:
        try:
            if entry.is_dir(follow_symlinks=False):
                self._enter(level, entry.name)
                return
            if not entry.is_file(follow_symlinks=False):
                return  # a link, a fifo, a socket: an entry, no bytes
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            return  # removed meanwhile
        except OSError as exc:
            self._fail(f"{self._where(entry.name)}: cannot look at it ({exc.strerror})")
            return
        if st.st_nlink > 1:
            key = (st.st_dev, st.st_ino)
            if key in self._linked:
                return
            self._linked.add(key)
        self._bytes += st.st_size

    def _enter(self, level: _Level, name: str) -> None:
        try:
            fd = os.open(name, _OPEN_DIR, dir_fd=level.fd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return  # removed, or swapped for a file or a link, since it was listed
            self._fail(f"{self._where(name)}: cannot list it ({exc.strerror})")
            return
        try:
            st = os.fstat(fd)
            if st.st_dev != self._device:
                os.close(fd)  # another filesystem mounted there: not the agent's to fill
                return
            self._stack.append(_Level(fd, name, st))
        except OSError as exc:
            os.close(fd)
            self._fail(f"{self._where(name)}: cannot list it ({exc.strerror})")
            return
        farthest = len(self._stack) - 1 - OPEN_LEVELS
        if farthest >= 1 and self._stack[farthest].held:  # the top (index 0) stays open: every pass starts there
            self._stack[farthest].let_go()

    def _where(self, name: str | None) -> str:
        """A short path below the top for a message (the first and last levels of a deep one)."""
        parts = [level.name for level in self._stack[1:] if level.name is not None] + ([name] if name else [])
        if len(parts) > 6:
            parts = [*parts[:2], f"… {len(parts) - 4} levels …", *parts[-2:]]
        return "/".join(parts)[:200] or "."

    def _fail(self, problem: str) -> None:
        self.problem = f"in {self.path}, {problem}"
        self._unwind()

    def _unwind(self) -> None:
        while self._stack:
            level = self._stack.pop()
            level.close(keep_fd=not self._stack)

    def close(self) -> None:
        """Release the descriptors; later steps do nothing."""
        self._closed = True
        self._unwind()
        if self._top is not None:
            os.close(self._top)
            self._top = None


@dataclass(frozen=True)
class PrivateUse:
    """An agent uid's private /tmp and /dev/shm together: bytes in use, inodes beyond their own, and
    whether one of them is full (no block or no inode left)."""

    bytes: int = 0
    inodes: int = 0
    full: bool = False


class DiskUse:
    """The disk use of one run, against its ``disk_mb``: fed by the sampler (:meth:`step`), read by the
    run's limit check (:meth:`over`).

    ``workspace``, when given, is a scan of it measured whole before the run started (:meth:`TreeScan.measure`):
    the run is held to its growth since. ``private`` reads the
    run's uid's private /tmp and /dev/shm (None: the agent has none; it writes the host's /tmp only as
    any user may, swept after its run). ``max_entries`` caps files, directories and links together
    (256 per MiB, as each private tmpfs's ``nr_inodes``).
    """

    def __init__(
        self, disk_mb: int, max_entries: int, scratch: str, *, workspace: TreeScan | None = None,
        private: Callable[[], PrivateUse] | None = None,
    ) -> None:
        self.limit_bytes = disk_mb * _MIB
        self.disk_mb = disk_mb
        self.max_entries = max_entries
        self.scratch = TreeScan(scratch)
        self.workspace = workspace
        self._baseline: tuple[int, int] | None = None
        """The workspace's (bytes, entries) when the run started."""
        if workspace is not None and workspace.passes:
            self._baseline = (workspace.bytes, workspace.entries)
        self._private = private
        self.private = PrivateUse()
        self.peak_bytes = 0

    def step(self, budget: int) -> int:
        """Measure a little more (at most about ``budget`` entries); returns the entries read."""
        used = self.scratch.step(budget)
        if self.workspace is not None and self._baseline is not None and used < budget:
            used += self.workspace.step(budget - used)
        self.read_private()
        return used

    def finish(self, budget: int | None = None) -> bool:
        """The run's processes are gone: measure everything once more, whole, until the answer of :meth:`over`
        is known. With ``budget``, at most about that many entries per tree (one listing of an empty scratch
        dir is the usual case): False when more remain, and the next call goes on. Blocking."""
        self.read_private()

        def enough() -> bool:
            return self.over(at_end=True) is not None

        if not self.scratch.measure(enough, budget):
            return False
        if self.workspace is not None and self._baseline is not None and not self.workspace.measure(enough, budget):
            return False
        self.peak_bytes = max(self.peak_bytes, self.total_bytes)
        return True

    def read_private(self) -> None:
        """Read the private /tmp and /dev/shm now (two ``statvfs``)."""
        if self._private is not None:
            self.private = self._private()
        self.peak_bytes = max(self.peak_bytes, self.total_bytes)

    def _growth(self) -> tuple[int, int]:
        if self.workspace is None or self._baseline is None:
            return 0, 0
        return (max(0, self.workspace.bytes - self._baseline[0]), max(0, self.workspace.entries - self._baseline[1]))

    @property
    def total_bytes(self) -> int:
        return self.scratch.bytes + self._growth()[0] + self.private.bytes

    def over(self, *, at_end: bool = False) -> str | None:
        """Why the run is over ``disk_mb`` (a sentence for its record), or None while it is within it.

        A full private dir counts only ``at_end`` (:meth:`finish`): the kernel holds it to its cap meanwhile,
        so the run may go on (and handle its ENOSPC) until it ends; it ends ``disk_exceeded`` all the same."""
        problem = self.scratch.problem or (self.workspace.problem if self.workspace is not None else None)
        if problem is not None:
            return f"covenant cannot measure the run's disk use, so it stopped it: {problem}"
        total = self.total_bytes
        grown_bytes, grown_entries = self._growth()
        where = (f"scratch dir {self.scratch.bytes} bytes"
                 + (f", workspace growth {grown_bytes} bytes" if self.workspace is not None else "")
                 + (f", private /tmp and /dev/shm {self.private.bytes} bytes" if self._private is not None else ""))
        if total > self.limit_bytes:
            return f"the run held {total} bytes on disk ({where}), over disk_mb = {self.disk_mb}"
        if self.private.full and at_end:
            return (f"the run filled its private /tmp or /dev/shm (each capped at disk_mb = {self.disk_mb}: "
                    f"{self.private.bytes} bytes, {self.private.inodes} files), so its writes there failed")
        entries = self.scratch.entries + grown_entries + self.private.inodes
        if entries > self.max_entries:
            return (f"the run made {entries} files, directories and links, over the {self.max_entries} that "
                    f"disk_mb = {self.disk_mb} allows (256 per MiB)")
        return None

    def close(self) -> None:
        self.scratch.close()
        if self.workspace is not None:
            self.workspace.close()
