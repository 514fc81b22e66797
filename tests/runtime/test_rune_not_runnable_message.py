"""A Rune package cannot run in this version: the error says so and promises nothing that does not exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from covenant.home import Home
from tests.manifest.helpers import write_rune


def test_covenant_run_on_a_rune_package_says_it_cannot_run_it(home: Home, tmp_path: Path) -> None:
    package = write_rune(tmp_path / "helper")
    result = subprocess.run([sys.executable, "-m", "covenant", "run", str(package), "hello", "--json"],
                            env=dict(os.environ), capture_output=True, text=True, timeout=120)
    record = json.loads(result.stdout)
    assert result.returncode == 4 and record["outcome"] == "spawn_failed"
    assert "this version cannot run them" in record["error"] and "docs/rune-packages.md" in record["error"]
    assert "host" not in record["error"].lower()
