"""Is a process still running? For tests that assert what outlived what, and how commands end."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterable

import psutil


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


def ctrl_c(proc: subprocess.Popen[str]) -> str:
    """Interrupt a ``covenant`` command as Ctrl-C does and check it said ``Aborted!`` and exited 1; its
    stderr. Killed if it has not ended within 60 s (and then the check fails)."""
    proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
    assert proc.returncode == 1 and stderr.strip().splitlines()[-1:] == ["Aborted!"], (proc.returncode, stderr)
    return stderr


def processes_marked(marker: str, among: Iterable[psutil.Process] | None = None) -> list[psutil.Process]:
    """Live processes (``among`` them, else any) whose ``COVENANT_INTENT_ID`` is ``marker``: a run's intent
    id, ``mcp:AGENT`` or ``replica:AGENT``."""
    found = []
    for proc in psutil.process_iter() if among is None else among:
        try:
            if proc.environ().get("COVENANT_INTENT_ID") == marker and alive(proc.pid):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def marked_processes_of(uid: int) -> list[psutil.Process]:
    """Live processes of real uid ``uid`` that covenant started (they carry a ``COVENANT_INTENT_ID``)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.uids().real == uid and "COVENANT_INTENT_ID" in proc.environ() and alive(proc.pid):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def described(procs: Iterable[psutil.Process]) -> list[str]:
    """Each process as "pid ppid marker started-at argv", for a failure message that names the culprit."""
    lines = []
    for proc in procs:
        try:
            parent = proc.parent()
            lines.append(f"{proc.pid} {proc.environ().get('COVENANT_INTENT_ID')} started={proc.create_time():.2f} "
                         f"{proc.cmdline()} parent={parent.pid if parent else None} "
                         f"{parent.cmdline() if parent else ''}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            lines.append(f"{proc.pid} (gone)")
    return lines
