"""Atomic file replacement and an advisory lock for read-modify-write edits."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from covenant.durable import replace_file

__all__ = ["atomic_write_text", "locked"]


def atomic_write_text(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace ``path`` with ``text``: temp file, fsync, rename, fsync the directory.

    A reader (the daemon re-reading grants.toml) sees the old file or the new
    one, never a half-written one. An existing file keeps its mode, but never
    more than ``mode`` (a 0644 grants.toml from an older covenant becomes 0600).
    """
    try:
        mode &= os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        pass
    replace_file(path, text.encode("utf-8"), mode)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``<path>.lock`` so two concurrent edits don't lose one."""
    lock_path = path.with_name(f".{path.name}.lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
