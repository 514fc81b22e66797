"""A private /tmp and /dev/shm for each agent uid: a mount namespace held open by covenant.

An agent uid can write to the host's world-writable /tmp and /dev/shm:
unbounded by ``disk_mb``, shared with every other user, kept after the run.
So each agent uid gets its own mount namespace in which /tmp and /dev/shm
are fresh tmpfs instances capped at the agent's ``disk_mb``. The agent's
processes enter it at exec (``setns`` in covenant's exec helper,
:func:`covenant.runtime._elf.read_credentials`): ~10 µs per spawn.

The namespace is made once per uid by a small root process (Python, once,
~30 ms) that then execs ``sleep infinity`` to hold it (~1 MB) and dies with
covenant (PDEATHSIG). Paths a private /tmp must not hide — the home and the
agent's package when they live under /tmp (tests do), interpreters, covenant's
own code — are bound back: before the new tmpfs covers /tmp, the top-level
entry of /tmp leading to each is bind-mounted into it.

Each tmpfs is capped in bytes (``disk_mb``) and in inodes (``nr_inodes``,
:meth:`MountNamespaces.inodes_for`): 150,000 empty files take no block but
~124 MB of the kernel's memory. When the last live run of the uid ends, what
it left is measured (``statvfs``: counted as the dispatch's disk use) and
removed through ``/proc/<holder>/root`` (:mod:`covenant.runtime.tree_removal`),
whatever ``statvfs`` reports: files without a block count as inodes used.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

from covenant.config import IsolationConfig
from covenant.runtime import host
from covenant.runtime.disk_use import PrivateUse
from covenant.runtime.holders import holder_alive, start_holder
from covenant.runtime.tree_removal import Removal, empty_dir

__all__ = ["MountNamespaces", "PRIVATE_DIRS", "DEFAULT_TMP_INODES", "INODES_PER_MIB", "MIN_TMP_INODES", "inodes_for"]

log = logging.getLogger("covenant.runtime")

PRIVATE_DIRS = ("/tmp", "/dev/shm")
DEFAULT_TMP_INODES: int = IsolationConfig.model_fields["tmp_inodes"].default
"""``[isolation] tmp_inodes``'s default: the most inodes of each private /tmp and /dev/shm (65,536: ~54 MB of the
kernel's memory when all are used)."""
INODES_PER_MIB = 256
"""Inodes per MiB of ``disk_mb`` (one per 4 KiB): a smaller disk gets fewer."""
MIN_TMP_INODES = 1024


def inodes_for(size_mb: int, max_inodes: int = DEFAULT_TMP_INODES) -> int:
    """Files a ``disk_mb`` of ``size_mb`` allows: :data:`INODES_PER_MIB` per MiB, at least
    :data:`MIN_TMP_INODES`, at most ``max_inodes`` (``[isolation] tmp_inodes``). A private dir's
    ``nr_inodes``, and the most entries a run's scratch dir may hold (:mod:`covenant.runtime.disk_use`)."""
    return min(max_inodes, max(MIN_TMP_INODES, size_mb * INODES_PER_MIB))

_SETUP = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
MS_NOSUID, MS_NODEV, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 4096, 8192, 16384, 1 << 18
def call(what, result):
    if result != 0:
        err = ctypes.get_errno()
        sys.stdout.write("error %s: %s\n" % (what, os.strerror(err)))
        sys.exit(1)
def mount(src, dst, fstype, flags, data):
    enc = lambda v: None if v is None else v.encode()
    call("mount %s" % dst, libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)))
spec = json.loads(sys.argv[1])
call("unshare", libc.unshare(0x20000))
mount(None, "/", None, MS_REC | MS_PRIVATE, None)
stage = spec["stage"]
for target, keep in spec["dirs"]:
    mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dk,nr_inodes=%d,mode=1777" % (spec["size_kib"], spec["inodes"]))
    for name in keep:
        src, dst = os.path.join(target, name), os.path.join(stage, name)
        if os.path.isdir(src):
            os.mkdir(dst)
        else:
            open(dst, "w").close()
        mount(src, dst, None, MS_BIND | MS_REC, None)
    mount(stage, target, None, MS_MOVE, None)
sys.stdout.write("ready\n")
sys.stdout.flush()
os.execv(spec["sleep"], [spec["sleep"], "infinity"])
"""


def _kept_entries(target: str, needed: Iterable[str]) -> list[str]:
    """Top-level names under ``target`` that lead to a needed path (resolved), sorted."""
    names = set()
    prefix = target.rstrip("/") + "/"
    for path in needed:
        for candidate in {os.path.abspath(path), os.path.realpath(path)}:
            if candidate.startswith(prefix):
                names.add(candidate[len(prefix) :].split("/", 1)[0])
    return sorted(names)


class _Holder:
    def __init__(self, process: subprocess.Popen[bytes], size_kib: int, baseline: dict[str, int]) -> None:
        self.process = process
        self.size_kib = size_kib
        self.baseline = baseline
        """Inodes in use in each private dir when it was made (its root, the entries bound back): more
        than that later is what the uid left."""

    def alive(self) -> bool:
        """Has the holder not exited? (Never reaped while it is listed in :attr:`MountNamespaces.holder_pids`.)"""
        return holder_alive(self.process)


def _inodes_used(pid: int, target: str) -> int:
    try:
        st = os.statvfs(f"/proc/{pid}/root{target}")
    except OSError:
        return 0
    return st.f_files - st.f_ffree


class MountNamespaces:
    """One held mount namespace per agent uid. Blocking methods.

    :meth:`namespace_for` may start a holder, which dies with the thread that started it: call it on
    the loop's thread or a launch thread (:mod:`covenant.runtime.workers`). Call the others off the loop.
    """

    def __init__(self, stage: Path, always_needed: Iterable[str], *, max_inodes: int = DEFAULT_TMP_INODES) -> None:
        self.stage = stage
        self.always_needed = list(always_needed)
        self.max_inodes = max_inodes
        self._holders: dict[int, _Holder] = {}
        self._lock = threading.Lock()
        self.holder_pids: frozenset[int] = frozenset()
        """The holders' pids: children of covenant that are never an agent's orphan, so the runner's
        scans for orphans skip them unread. A holder leaves this set before it is reaped."""
        self._sleep = shutil.which("sleep", path="/usr/bin:/bin")

    @staticmethod
    def available() -> bool:
        """Allowed to switch uid, with covenant's credentialed exec helper here (cached probe); whether
        mount(2) is allowed too is found by making a namespace."""
        return host.pdeathsig_wrapper(credentials=True) is not None

    def namespace_for(self, uid: int, size_mb: int, needed: Iterable[str]) -> int:
        """The pid of the process holding ``uid``'s private /tmp and /dev/shm (its mount namespace is
        ``/proc/<pid>/ns/mnt``), made on first use.

        Raises OSError (with the reason) when it cannot be made.
        """
        with self._lock:
            holder = self._holders.get(uid)
            if holder is not None:
                if holder.alive():
                    return holder.process.pid
                del self._holders[uid]
                self._list_pids()
                holder.process.wait()  # reaped only once it is off the list
            holder = self._start(size_mb, [*self.always_needed, *needed])
            self._holders[uid] = holder
            self._list_pids()
            return holder.process.pid

    def held(self, uid: int) -> bool:
        """Has ``uid`` a holder already (so :meth:`namespace_for` needs no new one unless it died)?"""
        return uid in self._holders

    def _list_pids(self) -> None:
        self.holder_pids = frozenset(holder.process.pid for holder in self._holders.values())

    def _start(self, size_mb: int, needed: list[str]) -> _Holder:

        if self._sleep is None:
            raise OSError("no sleep(1) on /usr/bin:/bin to hold the mount namespace")
        self.stage.mkdir(mode=0o700, parents=True, exist_ok=True)
        size_kib = max(size_mb, 1) * 1024
        spec = {
            "stage": str(self.stage),
            "size_kib": size_kib,
            "inodes": self.inodes_for(size_mb),
            "sleep": self._sleep,
            "dirs": [[target, _kept_entries(target, needed)] for target in PRIVATE_DIRS],
        }
        process = start_holder(_SETUP, spec, "a private /tmp and /dev/shm")
        return _Holder(process, size_kib, {target: _inodes_used(process.pid, target) for target in PRIVATE_DIRS})

    def inodes_for(self, size_mb: int) -> int:
        """``nr_inodes`` of a private dir of ``size_mb`` (:func:`inodes_for` with ``[isolation] tmp_inodes``)."""
        return inodes_for(size_mb, self.max_inodes)

    def usage(self, uid: int) -> PrivateUse:
        """What ``uid``'s private dirs hold now, together (two ``statvfs`` on tmpfs: memory only, ~10 µs);
        nothing when it has no holder. Any thread."""
        holder = self._holders.get(uid)
        if holder is None:
            return PrivateUse()
        used_bytes, inodes, full = 0, 0, False
        for target in PRIVATE_DIRS:
            try:
                st = os.statvfs(f"/proc/{holder.process.pid}/root{target}")
            except OSError:
                continue  # the holder is gone: so are the dirs and what they held
            used_bytes += (st.f_blocks - st.f_bfree) * st.f_frsize
            inodes += max(0, st.f_files - st.f_ffree - holder.baseline.get(target, 0))
            full = full or st.f_bavail == 0 or st.f_favail == 0
        return PrivateUse(used_bytes, inodes, full)

    def dirty(self, uid: int) -> bool:
        """Did ``uid`` leave anything in its private dirs: a block, or an inode more than they were made with
        (empty files take no block)? Two ``statvfs`` on tmpfs: memory only, ~10 µs."""
        with self._lock:
            holder = self._holders.get(uid)
        if holder is None or not holder.alive():
            return False
        for target in PRIVATE_DIRS:
            try:
                st = os.statvfs(f"/proc/{holder.process.pid}/root{target}")
            except OSError:
                return True  # cannot tell: look
            if st.f_blocks != st.f_bfree or st.f_files - st.f_ffree > holder.baseline.get(target, 0):
                return True
        return False

    def collect(self, uid: int) -> Removal:
        """Empty ``uid``'s private dirs, with its rights (the bound-back entries stay); ``bytes`` is what they
        held (``statvfs``: counted as the dispatch's disk use)."""
        with self._lock:
            holder = self._holders.get(uid)
        if holder is None or not holder.alive():
            return Removal()
        removal = Removal()
        root = f"/proc/{holder.process.pid}/root"
        for target in PRIVATE_DIRS:
            inside = root + target
            try:
                st = os.statvfs(inside)
                fd = os.open(inside, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                removal += Removal.failed(f"{target}: cannot open it ({exc.strerror})")
                continue
            try:
                emptied = empty_dir(fd, uid)
            finally:
                os.close(fd)
            removal += Removal((st.f_blocks - st.f_bfree) * st.f_frsize, emptied.complete,
                               f"{target}/{emptied.reason}" if emptied.reason else None, emptied.left)
        return removal

    def close(self) -> None:
        """Stop every holder (their namespaces and tmpfs contents go with them)."""
        with self._lock:
            holders, self._holders = list(self._holders.values()), {}
            self._list_pids()
        for holder in holders:
            holder.process.kill()
            holder.process.wait()
