"""Durable-write helpers shared by the append-only logs: write every byte, sync a directory entry.

Standard library only (the Rune replica imports :mod:`covenant.chainlog`, which uses this), and
only its core: the audit writer process imports this, and ``tempfile`` would bring shutil, random,
bz2 and lzma into it (≈ 0.5 MB of its RSS, issue 38).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["fsync_dir", "replace_file", "write_all"]


def fsync_dir(directory: Path, fsync: Callable[[int], None] = os.fsync) -> None:
    """Make a create, rename or unlink in ``directory`` durable (``fsync`` on the directory itself)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a write may take fewer bytes than given)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _new_beside(path: Path) -> tuple[int, str]:
    """A new empty file (0600) beside ``path`` under a random name no one else holds: ``O_EXCL`` makes
    the name ours, ``O_NOFOLLOW`` refuses a planted link. What ``tempfile.mkstemp`` does, without it."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def replace_file(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``data`` at ``path``, whole or not at all: a new file of ``mode`` (a name of its own beside ``path``, so
    two threads never share one), fsynced, renamed over ``path``, and the rename made durable."""
    fd, tmp = _new_beside(path)
    try:
        try:
            os.fchmod(fd, mode)
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
