"""Durable-write helpers shared by the append-only logs: write every byte, sync a directory entry.

Standard library only (the Rune replica imports :mod:`covenant.chainlog`, which uses this).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["fsync_dir", "write_all"]


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
