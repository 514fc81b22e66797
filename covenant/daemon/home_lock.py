"""One daemon per home: an exclusive ``flock`` on ``<home>/run/daemon.lock``, which holds the daemon's pid.

Taken before the daemon binds anything or opens its audit log, so a second ``covenant daemon`` on a home
already served stops with one message naming the first one's pid, whatever listeners it would have bound
(a socket path of its own included), and leaves no socket file behind; the first never notices. The kernel
releases the lock when the daemon exits, however it exits, so a stale file never blocks a start.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from covenant.errors import ConfigError
from covenant.home import Home, home_command

__all__ = ["LOCK_NAME", "serving_home"]

LOCK_NAME = "daemon.lock"


def _holder(fd: int) -> str:
    """The pid the lock file names (its first line), or ``unknown`` while the holder has not written it yet."""
    first = os.pread(fd, 64, 0).split(b"\n", 1)[0].strip()
    return first.decode() if first.isdigit() else "unknown"


@contextmanager
def serving_home(home: Home) -> Iterator[None]:
    """Hold ``home``'s daemon lock for the ``with`` body; ConfigError (exit 2) when a daemon already holds it."""
    home.run_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
    fd = os.open(home.run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"a daemon already serves this home, pid {_holder(fd)} ({home.root}); "
                f"`{home_command(home.root, 'status')}` shows it. Stop it first, or give this one a home of its own",
                path=str(home.root),
            ) from None
        pid = f"{os.getpid()}\n".encode()
        os.pwrite(fd, pid, 0)  # then cut what a longer pid left: a reader meanwhile still sees a whole first line
        os.ftruncate(fd, len(pid))
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock
