"""Operator-facing commands against a real daemon: what they read, print and exit with (issue 16)."""

from __future__ import annotations

import json

from tests.daemon.conftest import DaemonProcess


def test_agents_check_reads_the_files_not_the_daemon(daemon: DaemonProcess) -> None:
    daemon.add_agent("good", "echo.py", keywords=("good",))
    daemon.start()
    # Written after the daemon loaded its registry, and never reloaded: only the files know it.
    broken = daemon.home / "agents" / "broken.toml"
    broken.write_text("[agent\n")
    result = daemon.cli("agents", "check")
    assert result.returncode == 1, result.stderr
    assert str(broken) in result.stdout
    assert "2 manifest(s): 1 valid, 1 rejected" in result.stderr
    as_json = json.loads(daemon.cli("agents", "check", "--json").stdout)
    assert as_json["valid"] is False and as_json["agents"] == ["good@local"]
