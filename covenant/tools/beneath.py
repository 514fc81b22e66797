"""Open a path strictly beneath a directory fd: the kernel resolves it, never a string check then an open.

With ``openat2(2)`` (Linux 5.6+, syscall 437 on x86-64 and aarch64) the
whole path is resolved with ``RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS``:
absolute paths, ``..`` above the root, absolute symlinks, symlinks whose
target leaves the root and ``/proc/<pid>/…`` magic links all fail inside the
one syscall that opens the file, so a component swapped for a symlink between
a check and the open cannot redirect it. Symlinks that stay beneath the root
are followed.

Without ``openat2`` (``ENOSYS``), :func:`open_beneath` walks the path one
component at a time, each opened relative to its parent's fd with
``O_NOFOLLOW``: every symlink is refused, wherever it points.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat

__all__ = ["Escape", "open_beneath", "has_openat2", "split_relative", "FORCE_WALK"]

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08

FORCE_WALK = False
"""Tests set this to exercise the component walk on a kernel that has openat2."""


class Escape(Exception):
    """The path would leave the root (or goes through a link that could); the message says how."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_openat2_missing = _SYS_OPENAT2 is None


def has_openat2() -> bool:
    """Does this kernel (and architecture) give us openat2? Known after the first call."""
    return not _openat2_missing and not FORCE_WALK


def _openat2(dirfd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    """The raw syscall; raises OSError (ENOSYS when the kernel lacks it)."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def split_relative(path: str) -> list[str]:
    """The components of a relative path; raise :class:`Escape` for absolute paths and ``..``.

    This only words the refusal for the model: the open itself is what
    enforces it (openat2 or the walk), whatever the string looked like.
    """
    if "\0" in path:
        raise Escape("the path holds a NUL byte")
    if path.startswith("/"):
        raise Escape(f"{path!r} is absolute; paths are relative to the workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Escape(f"{path!r} has a '..' component; paths may not climb out of the workspace")
    return parts


def open_beneath(root_fd: int, path: str, flags: int, mode: int = 0o600) -> int:
    """An fd for ``path`` resolved beneath ``root_fd``; ``""`` or ``"."`` is the root itself.

    Raises :class:`Escape` when the path would leave the root, OSError for
    everything else (ENOENT, ENOTDIR, EISDIR, …).
    """
    global _openat2_missing
    parts = split_relative(path)
    rel = "/".join(parts) or "."
    if not _openat2_missing and not FORCE_WALK:
        try:
            return _openat2(root_fd, rel, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
        except OSError as exc:
            if exc.errno == errno.ENOSYS:
                _openat2_missing = True
            elif exc.errno == errno.EXDEV:
                raise Escape(f"{path!r} resolves outside the workspace (through '..' or a symlink)") from None
            elif exc.errno == errno.ELOOP:
                raise Escape(f"{path!r} goes through a magic link, a refused symlink or too many symlinks") from None
            else:
                raise
    return _walk(root_fd, parts, path, flags, mode)


def _refuse_link(dirfd: int, name: str, path: str, exc: OSError) -> None:
    """After a failed O_NOFOLLOW open: raise Escape if ``name`` is a symlink, else re-raise."""
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        raise exc from None
    if stat.S_ISLNK(st.st_mode):
        raise Escape(f"{path!r} goes through the symlink {name!r}; symlinks are not followed on this kernel") from None
    raise exc


def _walk(root_fd: int, parts: list[str], path: str, flags: int, mode: int) -> int:
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=root_fd)
    cur = os.dup(root_fd)
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                _refuse_link(cur, name, path, exc)
                raise
            os.close(cur)
            cur = nxt
        name = parts[-1]
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=cur)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                raise
            _refuse_link(cur, name, path, exc)
            raise
    finally:
        os.close(cur)
