"""Removing a tree an agent controls: no recursion, a bounded number of open directories, never through a
link, and with no more power over it than the agent's own uid has.

An agent can shape its HOME, its scratch dir and its private ``/tmp`` as it likes: 1,000 (or a million)
levels of directories, symbolic links to anywhere, directories it made unreadable to itself. The removal
must still finish, or say why not, and must never act outside that tree. ``shutil.rmtree`` recurses once
per level (RecursionError past the interpreter's limit, which lost a dispatch's record) and builds path
strings that outgrow ``PATH_MAX``; so:

- the walk is a loop over an explicit stack of open directories, every step relative to its parent's
  descriptor (``openat`` with ``O_NOFOLLOW | O_DIRECTORY``, ``unlinkat``, ``fstatat`` without following),
  so no path is ever resolved again and no link is ever followed;
- at most :data:`DEPTH_BUDGET` directories are open at once: a directory deeper than that is moved up
  (``renameat``) into the first level of the walk, to be removed from there on a later pass. Any depth
  is removed with a bounded number of descriptors, in time linear in the tree;
- it never crosses into another filesystem (a bind mount: a private ``/tmp``'s bound-back entries);
- it acts only where the agent's uid (``owner``) could act itself: inside directories that uid owns
  (whose owner may remove any entry, sticky bit or not, and may ``chmod`` them back to 0700), and, at a
  top it does not own (``/tmp``), only on the entries it owns. A directory of another uid found inside
  the tree is not entered: removed only when empty, else left in place and reported. The daemon
  does this as itself, with the agent's rights emulated by these ownership checks, rather than by taking
  the agent's uid: a credential change in one thread makes the whole daemon non-dumpable (the kernel's
  ``commit_creds``), which breaks the exec of covenant's helpers through ``/proc/<pid>/fd`` for a daemon
  that is not root, and a process per removal costs ~15 ms;
- what cannot be removed is counted and the first reason kept: :class:`Removal` says whether the removal
  was complete and why not, for the dispatch record (``cleanup``) and the log.

Blocking: call from a worker thread in trio code.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass

__all__ = ["DEPTH_BUDGET", "Removal", "empty_dir", "remove_owned_entries", "remove_tree"]

DEPTH_BUDGET = 16
"""Directories open at once in one walk (each holds two descriptors: its own and its listing's)."""
_RESCANS = 4
"""A directory that is still not empty after being emptied (entries appear meanwhile) is emptied again
this many times before it is left and reported."""
_MOVED_PREFIX = ".covenant-deep-"
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REASON_MAX = 400


@dataclass(frozen=True)
class Removal:
    """What a removal did: ``bytes`` (apparent size of the regular files removed), and whether it was
    ``complete``; when not, ``reason`` names the first entry left and why, and ``left`` counts them."""

    bytes: int = 0
    complete: bool = True
    reason: str | None = None
    left: int = 0

    def __add__(self, other: Removal) -> Removal:
        reasons = [r for r in (self.reason, other.reason) if r]
        return Removal(self.bytes + other.bytes, self.complete and other.complete,
                       "; ".join(reasons)[:_REASON_MAX] if reasons else None, self.left + other.left)

    @classmethod
    def failed(cls, reason: str) -> Removal:
        """Nothing could be done (the tree could not even be opened)."""
        return cls(0, False, reason[:_REASON_MAX], 1)


class _Level:
    """One open directory of the walk: its descriptor, its listing, its name in its parent."""

    __slots__ = ("fd", "entries", "name", "rescans", "moved_in", "owned", "left_before")

    def __init__(self, fd: int, name: str | None, owned: bool) -> None:
        self.fd = fd
        self.name = name
        self.owned = owned
        """Does the agent's uid own this directory (so it may remove any entry in it)?"""
        self.entries = os.scandir(fd)
        self.rescans = 0
        self.moved_in = 0
        """Deeper directories moved up into this one during the walk: it is listed again before it ends."""
        self.left_before = 0
        """Entries left (reported) before this directory was entered: more at its end explain why it stays."""

    def rescan(self) -> None:
        self.entries.close()
        self.entries = os.scandir(self.fd)
        self.moved_in = 0

    def close(self) -> None:
        self.entries.close()
        if self.name is not None:  # the top's descriptor is the caller's
            os.close(self.fd)


class _Walk:
    """One removal under an open top directory (see the module docstring)."""

    def __init__(self, top_fd: int, owner: int) -> None:
        self.owner = owner
        st = os.fstat(top_fd)
        self.device = st.st_dev
        self.stack = [_Level(top_fd, None, st.st_uid == owner)]
        self.bytes = 0
        self.left = 0
        self.reason: str | None = None

    def result(self) -> Removal:
        return Removal(self.bytes, self.left == 0, self.reason, self.left)

    def _path(self, name: str) -> str:
        """A short relative path for a message (the first and last levels of a deep one)."""
        parts = [level.name for level in self.stack[1:] if level.name is not None] + [name]
        if len(parts) > 6:
            parts = [*parts[:2], f"… {len(parts) - 4} levels …", *parts[-2:]]
        return "/".join(parts)[:200]

    def _leave(self, name: str, why: str) -> None:
        """An entry stays: counted, and the first reason kept."""
        self.left += 1
        if self.reason is None:
            self.reason = f"{self._path(name)}: {why}"

    def run(self) -> Removal:
        try:
            while self.stack:
                level = self.stack[-1]
                try:
                    entry = next(level.entries, None)
                except OSError as exc:  # the listing failed (the directory went away meanwhile)
                    entry = None
                    if exc.errno != errno.ENOENT:
                        self._leave(".", f"cannot list it ({exc.strerror})")
                if entry is None:
                    self._finish(level)
                else:
                    self._remove_entry(level, entry.name)
        finally:
            for level in self.stack:
                level.close()
        return self.result()

    def _finish(self, level: _Level) -> None:
        """``level`` is listed to its end: list it again if entries were moved into it, else remove it."""
        if level.moved_in:
            level.rescan()
            return
        self.stack.pop()
        level.close()
        if level.name is None:
            return  # the top is the caller's to keep or remove
        parent = self.stack[-1]
        try:
            os.rmdir(level.name, dir_fd=parent.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                self._leave(level.name, f"cannot remove the directory ({exc.strerror})")
            elif self.left > level.left_before:
                self.left += 1  # it holds what was left in it, reported already
            elif level.rescans < _RESCANS:
                self._enter(parent, level.name, rescans=level.rescans + 1)  # entries appeared: again
            else:
                self._leave(level.name, "entries kept appearing in it while it was removed")

    def _remove_entry(self, level: _Level, name: str) -> None:
        try:
            st = os.stat(name, dir_fd=level.fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        except OSError as exc:
            self._leave(name, f"cannot stat it ({exc.strerror})")
            return
        if not level.owned and st.st_uid != self.owner:
            return  # the top is not the agent's (/tmp): another user's entry is not part of what is removed
        if st.st_dev != self.device:
            if level.name is not None:
                self._leave(name, "another filesystem is mounted there")
            return  # at the top: bound back from the host (a private /tmp), never the agent's
        if stat.S_ISDIR(st.st_mode):
            if st.st_uid != self.owner:
                self._remove_foreign_dir(level, name, st.st_uid)
            elif len(self.stack) >= DEPTH_BUDGET:
                self._move_up(level, name)
            else:
                self._enter(level, name)
            return
        if self._unlink(level, name) and stat.S_ISREG(st.st_mode):
            self.bytes += st.st_size

    def _remove_foreign_dir(self, level: _Level, name: str, uid: int) -> None:
        """A directory of another uid inside the agent's own: the agent may remove it only when it is empty."""
        try:
            os.rmdir(name, dir_fd=level.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            why = "not empty" if exc.errno == errno.ENOTEMPTY else exc.strerror
            self._leave(name, f"a directory of uid {uid}, not the agent's to empty ({why})")

    def _unlink(self, level: _Level, name: str) -> bool:
        """Remove the non-directory ``name``; True when this call removed it."""
        for attempt in (1, 2):
            try:
                os.unlink(name, dir_fd=level.fd)
                return True
            except FileNotFoundError:
                return False
            except PermissionError as exc:
                if attempt == 2 or not self._opened_up(level):
                    self._leave(name, f"cannot remove it ({exc.strerror})")
                    return False
            except OSError as exc:
                self._leave(name, f"cannot remove it ({exc.strerror})")
                return False
        return False

    def _opened_up(self, level: _Level) -> bool:
        """Give the agent's own directory ``level`` its owner's rwx back (the agent could: it owns it), for
        a daemon without root's override; False when it is not the agent's or that is refused."""
        try:
            st = os.fstat(level.fd)
            if st.st_uid != self.owner or stat.S_IMODE(st.st_mode) & stat.S_IRWXU == stat.S_IRWXU:
                return False
            os.fchmod(level.fd, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
        except OSError:
            return False
        return True

    def _enter(self, parent: _Level, name: str, *, rescans: int = 0) -> None:
        """Open the agent's subdirectory ``name`` (never through a link) and push it on the stack."""
        try:
            fd = self._open_dir(parent, name)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link or a file since its stat
                self._unlink(parent, name)
            else:
                self._leave(name, f"cannot open the directory ({exc.strerror})")
            return
        st = os.fstat(fd)
        if st.st_dev != self.device or st.st_uid != self.owner:  # swapped since its stat
            os.close(fd)
            self._leave(name, "it changed while it was removed")
            return
        level = _Level(fd, name, True)
        level.rescans = rescans
        level.left_before = self.left
        self.stack.append(level)

    def _open_dir(self, parent: _Level, name: str) -> int:
        try:
            return os.open(name, _OPEN_DIR, dir_fd=parent.fd)
        except PermissionError:
            # A directory the agent made unreadable to itself: as its owner it may give itself access back.
            path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent.fd)
            try:
                st = os.fstat(path_fd)
                if st.st_uid != self.owner:
                    raise
                os.chmod(f"/proc/self/fd/{path_fd}", stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
                # Through the descriptor's own magic link (so no O_NOFOLLOW): exactly the directory opened above.
                return os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            finally:
                os.close(path_fd)

    def _move_up(self, level: _Level, name: str) -> None:
        """``name`` lies past the depth budget: move it into the walk's first level (the agent's own
        directory), which lists it again and removes it from there."""
        anchor = self.stack[1] if len(self.stack) > 1 else self.stack[0]
        moved = _MOVED_PREFIX + secrets.token_hex(8)
        try:
            os.rename(name, moved, src_dir_fd=level.fd, dst_dir_fd=anchor.fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            self._leave(name, f"deeper than {DEPTH_BUDGET} levels and cannot be moved up to be removed "
                              f"({exc.strerror})")
            return
        anchor.moved_in += 1


def empty_dir(top_fd: int, owner: int) -> Removal:
    """Remove what uid ``owner`` could remove in the open directory ``top_fd``, which stays (blocking).

    Every entry when ``owner`` owns the directory (a scratch dir); only ``owner``'s entries otherwise
    (``/tmp``). Entries on another filesystem (bind mounts) are left alone and not reported at the top.
    """
    try:
        return _Walk(top_fd, owner).run()
    except OSError as exc:
        return Removal.failed(f"cannot list it ({exc.strerror})")


def remove_tree(path: str, owner: int | None = None) -> Removal:
    """Remove ``path`` and, for a directory, everything in it that its owner could remove (blocking).

    ``owner`` is the uid whose rights the removal has: the directory's own owner when None (a scratch dir,
    given to the agent's uid before its run). ``path`` itself is never followed: a link is removed, not
    what it points at. The directory is removed from its parent once empty, by the daemon (the parent is
    the daemon's).
    """
    parent, name = os.path.split(os.path.abspath(path))
    try:
        parent_fd = os.open(parent, _OPEN_DIR)
    except OSError as exc:
        return Removal.failed(f"{parent}: cannot open it ({exc.strerror})")
    try:
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return Removal()
        if not stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=parent_fd)
            return Removal(st.st_size if stat.S_ISREG(st.st_mode) else 0)
        try:
            fd = os.open(name, _OPEN_DIR, dir_fd=parent_fd)
        except OSError as exc:
            return Removal.failed(f"{path}: cannot open it ({exc.strerror})")
        try:
            removal = empty_dir(fd, os.fstat(fd).st_uid if owner is None else owner)
        finally:
            os.close(fd)
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if removal.complete:
                removal = removal + Removal.failed(f"{path}: cannot remove it ({exc.strerror})")
        return removal
    finally:
        os.close(parent_fd)


def remove_owned_entries(dirs: tuple[str, ...], uid: int) -> Removal:
    """Remove what ``uid`` left directly in the shared dirs ``dirs`` (``/tmp``, ``/dev/shm`` of the host, when
    agent uids have no private ones), with its rights: its own entries only (blocking)."""
    removal = Removal()
    for parent in dirs:
        try:
            fd = os.open(parent, _OPEN_DIR)
        except OSError as exc:
            removal += Removal.failed(f"{parent}: cannot open it ({exc.strerror})")
            continue
        try:
            emptied = empty_dir(fd, uid)
        finally:
            os.close(fd)
        removal += Removal(emptied.bytes, emptied.complete, f"{parent}/{emptied.reason}" if emptied.reason else None,
                           emptied.left)
    return removal
