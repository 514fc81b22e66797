"""Hostile manifests through a real daemon: it starts, reloads, answers, and loads the valid files beside them."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.daemon.conftest import DaemonProcess
from tests.manifest.hostile import EXPECTED, problem_name, write_hostile


def _peak_rss_mb(pid: int) -> float:
    """VmHWM: the most resident memory the process ever had."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def _timed_status(daemon: DaemonProcess) -> float:
    started = time.monotonic()
    status = daemon.api("GET", "/v1/status")
    elapsed = time.monotonic() - started
    assert isinstance(status, dict) and status["pid"] == daemon.process.pid
    return elapsed


def _rejected_cases(daemon: DaemonProcess) -> set[str]:
    agents = daemon.api("GET", "/v1/agents")
    return {problem_name(Path(p["path"]), daemon.home / "agents") for p in agents["problems"]}


def test_the_daemon_starts_and_reloads_beside_every_hostile_file(daemon: DaemonProcess) -> None:
    agents = daemon.home / "agents"
    write_hostile(agents)
    daemon.start()
    assert daemon.process is not None
    listed = daemon.api("GET", "/v1/agents")  # 200, never 500 (a 10,000-key-deep table used to break it)
    assert [a["id"] for a in listed["agents"]] == ["good@local"]
    assert _rejected_cases(daemon) == set(EXPECTED)
    assert _timed_status(daemon) < 5

    # A valid agent dropped in beside them is loaded by a reload, over the API and on SIGHUP.
    daemon.add_agent("fresh", "echo.py", keywords=("fresh",))
    reloaded = daemon.api("POST", "/v1/reload")
    assert "fresh@local" in reloaded["agents"] and "good@local" in reloaded["agents"]
    daemon.add_agent("later", "echo.py", keywords=("later",))
    daemon.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 60
    while "later@local" not in [a["id"] for a in daemon.api("GET", "/v1/agents")["agents"]]:
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.1)
    assert _rejected_cases(daemon) == set(EXPECTED)
    dispatched = daemon.cli("dispatch", "fresh words", "--agent", "fresh@local")
    assert dispatched.returncode == 0, dispatched.stderr
    assert _timed_status(daemon) < 5
    peak = _peak_rss_mb(daemon.process.pid)
    assert peak < 300, f"daemon peak RSS {peak:.0f} MB with a 50 MB manifest and an alias bomb in agents/"
    assert daemon.stop() == 0
