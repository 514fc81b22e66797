"""Is a process still running? For tests that assert what outlived what."""

from __future__ import annotations

import time


def alive(pid: int) -> bool:
    """Is ``pid`` running (not gone, not a zombie)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float) -> bool:
    """True once ``pid`` has stopped running, False if it still runs after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
