"""Host-wide ownership of agent uids: one lock file per uid under ``/run/covenant-uids``.

Each home picks its agents' uids from its ``[isolation] uid_range`` and keeps the choice in its own
table. Two homes on one host (a second daemon, a test suite, a benchmark) may be given the same
range, and a table alone would then hand one uid to two agents: one reads the other's workspace,
and a sweep for one kills the other's processes. So a uid belongs to a home only while the home
holds an exclusive ``flock`` on ``/run/covenant-uids/<uid>.lock``. The folder is root's, 0755: an
agent uid can neither take nor fake a lock. The lock file names the home (its state dir), so a
second process of the same home (``covenant run`` beside its daemon) shares the uid instead of
losing it. A lock file stays after its home stops: :func:`ever_an_agent_uid` treats every uid that
has one as an agent's, which is what a check that must fail closed wants.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from covenant.errors import ConfigError

__all__ = ["LOCK_DIR", "UidLocks", "ever_an_agent_uid"]

LOCK_DIR = Path("/run/covenant-uids")


@dataclass
class _Held:
    fd: int
    owner: str
    users: int


# Per process, not per UidLocks: flock conflicts between two open file descriptions even within one
# process, and one process may open a home twice (a test, `covenant run` in the daemon's process tree).
_held: dict[int, _Held] = {}
_held_lock = threading.Lock()


def _lock_path(lock_dir: Path, uid: int) -> Path:
    return lock_dir / f"{uid}.lock"


def ever_an_agent_uid(uid: int, lock_dir: Path = LOCK_DIR) -> bool:
    """Was ``uid`` ever given to an agent by a home on this host (a lock file exists for it)?"""
    return _lock_path(lock_dir, uid).exists()


class UidLocks:
    """The uid locks one home holds. Thread-safe; blocking (file I/O)."""

    def __init__(self, owner: str, lock_dir: Path = LOCK_DIR) -> None:
        self.owner = owner
        """Who holds the locks: the home's state dir, resolved."""
        self.lock_dir = lock_dir
        self._mine: set[int] = set()
        self._checked = False

    def _check_dir(self) -> None:
        """Make the lock folder (root's, 0755) or check that it is such; ConfigError otherwise."""
        if self._checked:
            return
        try:
            os.mkdir(self.lock_dir, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(
                f"cannot make {self.lock_dir} ({exc.strerror}): covenant records there which agent uids each "
                "home holds (systemd/covenant.tmpfiles.conf makes it at boot)", path=str(self.lock_dir)) from None
        st = os.lstat(self.lock_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise ConfigError(
                f"{self.lock_dir} must be a directory owned by root and writable by root only (it is "
                f"uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): remove it, covenant makes it again",
                path=str(self.lock_dir))
        self._checked = True

    def take(self, uid: int) -> bool:
        """Hold ``uid`` for this home; False when another home holds it now."""
        with _held_lock:
            held = _held.get(uid)
            if held is not None:
                if held.owner != self.owner:
                    return False
                if uid not in self._mine:
                    held.users += 1
                    self._mine.add(uid)
                return True
            self._check_dir()
            path = _lock_path(self.lock_dir, uid)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                holder = os.pread(fd, 4096, 0).decode(errors="replace").split("\n", 1)[0]
                os.close(fd)
                return holder == self.owner  # another process of this home holds it: shared
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{self.owner}\n{os.getpid()}\n".encode(), 0)
            _held[uid] = _Held(fd, self.owner, 1)
            self._mine.add(uid)
            return True

    def release(self, uid: int) -> None:
        """This home no longer gives ``uid`` to an agent (its lock file stays, unlocked)."""
        with _held_lock:
            if uid not in self._mine:
                return
            self._mine.discard(uid)
            held = _held.get(uid)
            if held is None:
                return
            held.users -= 1
            if held.users <= 0:
                del _held[uid]
                os.close(held.fd)  # closing the last descriptor releases the flock

    def held(self) -> frozenset[int]:
        with _held_lock:
            return frozenset(self._mine)

    def close(self) -> None:
        for uid in self.held():
            self.release(uid)
