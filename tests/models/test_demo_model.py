"""scripts/demo_model.sh: the demo starts the stand-in, gives the [providers.local] table for it, and stops it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from covenant.config import load_config
from covenant.home import Home
from tests.conftest import REPO_ROOT
from tests.processes import alive


def test_start_configure_and_stop_leave_no_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "covenant.toml").write_text('agents_dir = "agents"\n')
    script = f"""
set -euo pipefail
source scripts/demo_model.sh
demo_model_start {tmp_path} {sys.executable}
echo "pid=$DEMO_MODEL_PID"
printf '%s\n' "$DEMO_MODEL_TOML" >> "$COVENANT_HOME/covenant.toml"
base=$(sed -n 's/^base_url = "\\(.*\\)"$/\\1/p' "$COVENANT_HOME/covenant.toml")
{sys.executable} -c "import httpx, sys; r = httpx.post(sys.argv[1] + '/chat/completions', json={{'messages': [{{'role': 'user', 'content': 'hi'}}]}}); print(r.json()['choices'][0]['message']['content'])" "$base"
demo_model_stop
"""
    result = subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env={**os.environ, "COVENANT_HOME": str(home)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "[stand-in model]" in result.stdout
    pid = int(next(line for line in result.stdout.splitlines() if line.startswith("pid="))[4:])
    assert not alive(pid)
    local = load_config(Home(home)).providers["local"]
    assert (local.kind, local.model, local.api_key_env) == ("openai", "covenant-stand-in-model", None)
    assert local.base_url.startswith("http://127.0.0.1:") and local.base_url.endswith("/v1")


def test_an_unknown_model_kind_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(["bash", "-c", f"source scripts/demo_model.sh; demo_model_start {tmp_path} {sys.executable}"],
                            cwd=REPO_ROOT, env={**os.environ, "COVENANT_DEMO_MODEL": "gpt9", "COVENANT_HOME": str(tmp_path)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "must be standin or real" in result.stderr
