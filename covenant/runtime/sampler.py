"""One sampler for every running dispatch: tree membership, CPU, RSS and disk use.

Each tick walks ``/proc/<pid>/task/*/children`` from every agent's root
(through files kept open while the process lives, see ``_procfs.OpenProcess``),
re-checks processes seen before (a descendant that called setsid() and lost
its parent is still ours), and looks at covenant's own children: as a child
subreaper, covenant adopts orphaned descendants, which are attributed to
their dispatch by the ``COVENANT_INTENT_ID`` marker in their environment.
Each tick also measures the runs' disk use a little further, within one
budget of directory entries for all of them (:mod:`covenant.runtime.disk_use`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable

import trio

from covenant.runtime import _procfs
from covenant.runtime.disk_use import ENTRIES_PER_TICK, MIN_ENTRIES_PER_RUN, DiskUse

__all__ = ["ProcessTree", "Sampler", "MARKER_NAME"]


MARKER_NAME = "COVENANT_INTENT_ID"


class ProcessTree:
    """The processes of one dispatch and their accumulated figures."""

    def __init__(self, root: int, intent_id: str) -> None:
        self.root = root
        self.marker = f"{MARKER_NAME}={intent_id}".encode()
        self.members: dict[int, int] = {}
        """pid -> starttime of every live process known to belong to the dispatch."""
        self.cpu_ms = 0
        self.rss_kib = 0
        """The members' RSS summed, at the last sample: cheap (from ``stat``), and never under
        :meth:`own_resident_kib`."""
        self.peak_rss_kib = 0
        self._open: dict[int, _procfs.OpenProcess] = {}
        """The members' /proc files, kept open between samples until :meth:`close`."""
        self._closed = False
        # The root is not read here: /proc/<pid>/stat of a process in the middle
        # of execve blocks until the exec is done (~0.7 ms). Its pid cannot be
        # reused before covenant reaps it, so the first refresh may add it.

    def refresh(self, adopted: Iterable[int] = ()) -> None:
        """Rebuild membership from the root, known members and ``adopted`` pids; update figures."""
        if not adopted and self._refresh_lone_root():
            return
        seen: dict[int, _procfs.ProcStat] = {}
        stack = [self.root, *self.members, *adopted]
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            proc, stat = self._read(pid)
            if stat is None:
                continue
            known = self.members.get(pid)
            if known is not None and known != stat.starttime:
                continue  # the pid was reused by an unrelated process
            seen[pid] = stat
            stack.extend(proc.children(stat.num_threads) if proc else _procfs.children(pid, stat.num_threads))
        for pid in self._open.keys() - seen.keys():
            self._open.pop(pid).close()
        self.members = {pid: stat.starttime for pid, stat in seen.items()}
        ticks = sum(stat.cpu_ticks for stat in seen.values())
        self.cpu_ms = max(self.cpu_ms, ticks * 1000 // _procfs.CLK_TCK)
        self.rss_kib = sum(stat.rss_kib for stat in seen.values())
        self.peak_rss_kib = max(self.peak_rss_kib, self.rss_kib)

    def _refresh_lone_root(self) -> bool:
        """The usual sample, cheaply: the tree is its root alone and still has no child. False when that
        is not so (or not known), and :meth:`refresh` walks the tree instead."""
        if len(self.members) != 1 or (proc := self._open.get(self.root)) is None:
            return False
        stat = proc.stat()
        if stat is None or stat.starttime != self.members.get(self.root) or proc.children(stat.num_threads):
            return False
        self.cpu_ms = max(self.cpu_ms, stat.cpu_ticks * 1000 // _procfs.CLK_TCK)
        self.rss_kib = stat.rss_kib
        self.peak_rss_kib = max(self.peak_rss_kib, stat.rss_kib)
        return True

    def _read(self, pid: int) -> tuple[_procfs.OpenProcess | None, _procfs.ProcStat | None]:
        """``pid``'s stat through its open files (opened now if need be), or by path past the fd limit."""
        proc = self._open.get(pid)
        if proc is not None:
            stat = proc.stat()
            if stat is not None:
                return proc, stat
            # That process has exited; the pid may already name another one.
            self._open.pop(pid).close()
        if not self._closed:
            proc = _procfs.OpenProcess.open(pid)
            if proc is not None:
                stat = proc.stat()
                if stat is None:
                    proc.close()
                    return None, None
                self._open[pid] = proc
                return proc, stat
        return None, _procfs.read_stat(pid)

    def close(self) -> None:
        """Close the members' files; later refreshes read by path."""
        self._closed = True
        for proc in self._open.values():
            proc.close()
        self._open.clear()

    def own_resident_kib(self) -> int:
        """The resident memory the members hold of their own now (:func:`covenant.runtime._procfs.own_resident_kib`),
        summed: what ``memory_mb`` limits. Read from each member's ``status`` only when asked, that is when
        :attr:`rss_kib` is over the limit (it never is under this figure): summed RSS counts the pages of a
        binary and its libraries once per process mapping them, Chromium's ≈ 150 MiB six times and more."""
        return sum(_procfs.own_resident_kib(pid) for pid in self.members)

    def note_root_hwm(self) -> None:
        """Fold the root's own RSS high-water mark (VmHWM) into the peak."""
        self.peak_rss_kib = max(self.peak_rss_kib, _procfs.read_hwm_kib(self.root))

    def has_descendants(self) -> bool:
        """Has a sample seen any process of the dispatch besides the root?"""
        return any(pid != self.root for pid in self.members)

    def owns(self, pid: int) -> bool:
        """Is ``pid`` (not yet a member) marked as ours through its environment?"""
        return _procfs.environ_has(pid, self.marker)


class Sampler:
    """The one periodic task that samples every registered tree.

    Each registered tree has a callback run after its figures are updated;
    the runner uses it to check the dispatch's limits.
    """

    def __init__(self, interval_ms: int, helper_pids: Callable[[], Collection[int]] = tuple) -> None:
        self.interval = interval_ms / 1000
        self.helper_pids = helper_pids
        """covenant's own long-lived children (mount namespace holders): never read as orphans."""
        self._trees: dict[ProcessTree, Callable[[], None]] = {}
        self._disks: dict[DiskUse, None] = {}
        self.disk_entries = 0
        """Directory entries read by the last tick's disk measurements (at most
        max(:data:`ENTRIES_PER_TICK`, :data:`MIN_ENTRIES_PER_RUN` per run))."""
        self.foreign: dict[tuple[int, int], None] = {}
        """Children of covenant known to belong to no run, as (pid, starttime): their environment
        is read once."""
        self.ticks = 0

    def register(self, tree: ProcessTree, after_sample: Callable[[], None]) -> None:
        self._trees[tree] = after_sample

    def unregister(self, tree: ProcessTree) -> None:
        """Stop sampling ``tree`` and close the files it holds open."""
        self._trees.pop(tree, None)
        tree.close()

    def watch_disk(self, disk: DiskUse) -> None:
        """Measure ``disk`` on each tick from now on (before the limit checks run)."""
        self._disks[disk] = None

    def unwatch_disk(self, disk: DiskUse) -> None:
        """Stop measuring ``disk`` (its owner closes it)."""
        self._disks.pop(disk, None)

    async def run(self) -> None:
        """Tick forever; cancelled by the runner's nursery on close."""
        while True:
            await trio.sleep(self.interval)
            if self._trees:
                self.tick()

    def tick(self) -> None:
        """Sample every tree once (one pass over /proc for all dispatches)."""
        self.ticks += 1
        if self._disks:
            share = max(MIN_ENTRIES_PER_RUN, ENTRIES_PER_TICK // len(self._disks))
            self.disk_entries = sum(disk.step(share) for disk in list(self._disks))
        adopted = adopted_orphans(list(self._trees), self.foreign, self.helper_pids())
        for tree, after_sample in list(self._trees.items()):
            tree.refresh(adopted.get(tree, ()))
            after_sample()


def adopted_orphans(
    trees: list[ProcessTree], foreign: dict[tuple[int, int], None] | None = None, helpers: Collection[int] = ()
) -> dict[ProcessTree, list[int]]:
    """covenant's own children that belong to a dispatch but are not its root.

    Orphans are adopted by covenant's main thread (see
    :func:`~covenant.runtime._procfs.thread_children`); the runner spawns
    from the main thread too, so its roots are found there as well.

    An orphan already known as a member is attributed directly; an unknown one
    by its environment marker. Children that belong to no dispatch are
    remembered in ``foreign`` (pid, starttime) so their environment is read once; ``helpers``
    (covenant's own long-lived children) are skipped unread.
    """
    roots = {tree.root for tree in trees}
    out: dict[ProcessTree, list[int]] = {}
    for pid in _procfs.thread_children(os.getpid()):
        if pid in roots or pid in helpers:
            continue
        owner = next((tree for tree in trees if pid in tree.members), None)
        if owner is None:
            stat = _procfs.read_stat(pid)
            if stat is None:
                continue
            key = (pid, stat.starttime)
            if foreign is not None and key in foreign:
                continue
            owner = next((tree for tree in trees if tree.owns(pid)), None)
            if owner is None:
                if foreign is not None:
                    if len(foreign) > 4096:
                        foreign.clear()
                    foreign[key] = None
                continue
        out.setdefault(owner, []).append(pid)
    return out
