"""The audit log's disk fills up under a live daemon: fail closed, and no agent runs unaudited.

The home's audit directory is a small tmpfs (a real file system, mounted by
root; CI runs as root), filled to the last byte while the daemon serves.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonProcess, agent_processes
from tests.daemon.test_daemon_e2e import audit_records, status


@pytest.fixture
def small_audit_disk(daemon: DaemonProcess) -> Iterator[Path]:
    audit_dir = daemon.home / "audit"
    audit_dir.mkdir(mode=0o700, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(audit_dir)], check=True)
    try:
        yield audit_dir
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()
        subprocess.run(["umount", str(audit_dir)], check=True)


def fill(path: Path) -> None:
    """Write zeros to ``path`` until the file system has no byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                os.write(fd, bytes(4096))
            except OSError:
                break
        while True:  # the last partial block
            try:
                os.write(fd, b"\0")
            except OSError:
                break
    finally:
        os.close(fd)


def test_full_audit_disk_refuses_dispatches_and_no_agent_runs_unaudited(
    daemon: DaemonProcess, small_audit_disk: Path
) -> None:
    # Beside the home (agent uids reach it), writable by the agent's uid.
    marks = daemon.home.parent / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    daemon.add_agent("mark", "mark.py", keywords=("mark",))
    daemon.start()
    first = json.loads(daemon.cli("dispatch", f"mark {marks}", "--json", check=True).stdout)
    assert first["outcome"] == "ok" and [p.name for p in marks.iterdir()] == [first["intent_id"]]
    acknowledged = [first["intent_id"]]

    fill(small_audit_disk / "filler")
    # The log's last page may still hold a commit or two; the first one that does not fit fails.
    for _ in range(50):
        answer = daemon.cli("dispatch", f"mark {marks}", "--json")
        if answer.returncode != 0:
            break
        acknowledged.append(json.loads(answer.stdout)["intent_id"])
    assert answer.returncode == 5 and "audit" in answer.stderr, answer.stderr
    assert not agent_processes(daemon.home)
    audit = status(daemon)["audit"]
    assert audit["healthy"] is False and "No space left" in audit["failure"]

    ran = {p.name for p in marks.iterdir()}
    again = daemon.cli("dispatch", f"mark {marks}")
    assert again.returncode == 5 and "audit" in again.stderr
    assert {p.name for p in marks.iterdir()} == ran  # refused before anything was spawned

    # Space comes back: the daemon reopens the log by itself, no restart.
    (small_audit_disk / "filler").unlink()
    deadline = time.monotonic() + 90  # first retry after 1 s, then 2, 4, ...: bounds a broken run only
    while not status(daemon)["audit"]["healthy"]:
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.2)
    resumed = json.loads(daemon.cli("dispatch", f"mark {marks}", "--json", check=True).stdout)
    assert resumed["outcome"] == "ok"
    acknowledged.append(resumed["intent_id"])
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.log()
    verify = daemon.cli("audit", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    records = audit_records(daemon)
    spawned = {r["data"]["intent"] for r in records if r["type"] == "agent.spawned"}
    completed = {r["data"]["intent"] for r in records if r["type"] == "intent.completed"}
    assert ran <= spawned  # no agent ran without its agent.spawned being durable first
    assert set(acknowledged) <= completed  # nothing acknowledged is lost
    resume = [r for r in records if r["type"] == "audit.resume"]
    assert len(resume) == 1 and resume[0]["data"]["refused"] >= 2 and "No space left" in resume[0]["data"]["error"]


def test_sigterm_and_start_on_a_full_audit_disk_end_cleanly(daemon: DaemonProcess, small_audit_disk: Path) -> None:
    daemon.start()
    fill(small_audit_disk / "filler")
    deadline = time.monotonic() + 60
    while daemon.cli("dispatch", "anything").returncode != 5 or status(daemon)["audit"]["healthy"]:
        assert time.monotonic() < deadline, daemon.log()
    assert daemon.stop() == 0  # drained: nothing was in flight
    assert "Traceback" not in daemon.log()
    assert "daemon.stop could not be recorded" in daemon.log()

    started = daemon.cli("daemon", timeout=60)  # in the foreground: it must refuse and exit by itself
    assert started.returncode == 5, started.stdout + started.stderr
    assert "Traceback" not in started.stderr and "free space" in started.stderr, started.stderr
