"""Durable-write helpers shared by the append-only logs: write every byte, sync a directory entry.

Standard library only (the Rune replica imports :mod:`covenant.chainlog`, which uses this).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
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


def replace_file(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``data`` at ``path``, whole or not at all: a new file of ``mode`` (a name of its own beside ``path``, so
    two threads never share one), fsynced, renamed over ``path``, and the rename made durable."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
