"""The demo's model servers: scripts/demo_model.sh starts the stand-in (or refuses a real one it cannot start), gives
the [providers.local] table for it, and stops it; scripts/real_model.sh reports its long compile as it goes."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
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


def _start_real(tmp_path: Path, port: int, venv: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COVENANT_DEMO_MODEL": "real", "COVENANT_REAL_MODEL_PORT": str(port), "COVENANT_HOME": str(tmp_path)}
    if venv is not None:
        env["VENV"] = str(venv)
    script = f"source scripts/demo_model.sh; demo_model_start {tmp_path} {sys.executable}; status=$?; echo \"pid=$DEMO_MODEL_PID\"; exit $status"
    return subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_real_model_refuses_a_port_already_in_use(tmp_path: Path) -> None:
    """Whatever listens on the port would answer the demo under the real model's name: nothing is started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _start_real(tmp_path, port)
    assert result.returncode != 0, result.stdout
    assert f"127.0.0.1:{port} is already in use" in result.stderr and "COVENANT_REAL_MODEL_PORT" in result.stderr
    assert "pid=\n" in result.stdout and not (tmp_path / "model.log").exists()  # the server was never started


def test_a_real_model_server_that_fails_to_start_fails_the_demo(tmp_path: Path) -> None:
    """The real server exits (here: a venv whose python fails at once); the demo stops with its log, no stand-in."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\necho 'no model in this venv' >&2\nexit 3\n")
    (venv / "bin" / "python").chmod(0o755)
    with socket.socket() as probe:  # a port that is free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _start_real(tmp_path, port, venv)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the real model server exited" in result.stderr and "no model in this venv" in result.stderr
    pid = int(next(line for line in result.stdout.splitlines() if line.startswith("pid="))[4:])
    assert not alive(pid)
    assert "[providers.local]" not in result.stdout and "stand-in" not in result.stdout + result.stderr


def _progress(tmp_path: Path, *command: str) -> subprocess.Popen[str]:
    """scripts/real_model.sh's with_progress (what `install` wraps pip's compile in), a line every second."""
    line = "source scripts/real_model.sh; with_progress " + " ".join(shlex.quote(a) for a in (str(tmp_path / "build.log"), "building", *command))
    return subprocess.Popen(["bash", "-c", line], cwd=REPO_ROOT, env={**os.environ, "REAL_MODEL_PROGRESS_S": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_long_compile_reports_its_progress_while_it_runs(tmp_path: Path) -> None:
    """The build waits for a file the test creates only after a progress line came: no timing decides it."""
    go = tmp_path / "go"
    build = tmp_path / "build.sh"
    build.write_text("#!/bin/sh\necho 'Building wheel for llama-cpp-python (pyproject.toml): started'\n"
                     "printf '[12/84] Building C object ggml.c.o\\r'\n"
                     f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.1; done\necho '[84/84] Linking'\n")
    build.chmod(0o755)
    process = _progress(tmp_path, str(build))
    try:
        assert process.stdout is not None
        seen = []
        deadline = time.monotonic() + 60
        while not any("[12/84] Building C object" in line for line in seen):
            assert time.monotonic() < deadline and process.poll() is None, seen
            seen.append(process.stdout.readline())
        assert seen[0].startswith("building (log: ") and re.match(r"  \.\.\. \d+ s: \[12/84\] Building C object", seen[-1])
        go.touch()
        rest, errors = process.communicate(timeout=60)
    finally:
        go.touch()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, errors
    assert re.search(r"^  done in \d+ s$", rest, re.M)

    failing = _progress(tmp_path, "sh", "-c", "echo 'error: cmake not found'; exit 7")
    out, errors = failing.communicate(timeout=60)
    assert failing.returncode == 7 and "failed (exit 7)" in errors and "error: cmake not found" in errors, out + errors
