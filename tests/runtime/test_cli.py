"""`covenant run`, `history` and `show` as real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from covenant.home import Home
from tests.conftest import EXAMPLES_DIR, agent_uid_range, isolation_table, require_tool
from tests.processes import ctrl_c
from tests.runtime.conftest import AGENTS

COVENANT = [str(Path(sys.executable).parent / "covenant")]


@pytest.fixture(autouse=True)
def own_uid_range(home: Home) -> None:
    """`covenant run` as root runs the agent as a uid of the home's range: one no other test uses."""
    home.config_path.write_text(isolation_table(agent_uid_range()))


def covenant(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COVENANT, "--home", str(home.root), *args], capture_output=True, text=True, timeout=120,
                          env=os.environ.copy())


def write_manifest(folder: Path, **resources: object) -> Path:
    shutil.copy(AGENTS / "fault.py", folder / "fault.py")  # an entry lies inside its package folder
    lines = ["[agent]", 'id = "fault@local"', 'name = "fault"', 'version = "0.1.0"', 'runtime = "python3"',
             'entry = "fault.py"', "[resources]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in resources.items()]
    path = folder / "fault.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_prints_text_and_records(home: Home, agent_reachable_dir: Path) -> None:
    manifest = write_manifest(agent_reachable_dir)
    done = covenant(home, "run", str(manifest), "echo hello world")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello world\n"
    history = covenant(home, "history", "--json")
    records = json.loads(history.stdout)
    assert len(records) == 1 and records[0]["outcome"] == "ok"
    shown = covenant(home, "show", records[0]["intent_id"], "--json")
    assert json.loads(shown.stdout)["result"]["text"] == "hello world"
    assert "ok" in covenant(home, "show", records[0]["intent_id"]).stdout
    assert covenant(home, "show", "no-such-intent").returncode == 1


@pytest.mark.parametrize(("text", "code", "outcome"), [("error", 1, "agent_error"), ("exit 3", 4, "crashed"),
                                                        ("garbage", 4, "protocol_error")])
def test_run_exit_codes(home: Home, agent_reachable_dir: Path, text: str, code: int, outcome: str) -> None:
    done = covenant(home, "run", str(write_manifest(agent_reachable_dir)), text, "--json")
    assert done.returncode == code, done.stderr
    assert json.loads(done.stdout)["outcome"] == outcome


def test_run_timeout_leaves_nothing(home: Home, agent_reachable_dir: Path) -> None:
    done = covenant(home, "run", str(write_manifest(agent_reachable_dir, cpu_ms_per_task=300)), "escape stay", "--json")
    assert done.returncode == 4
    record = json.loads(done.stdout)
    assert record["outcome"] == "timeout"
    from tests.runtime.conftest import leftovers

    assert leftovers(record["intent_id"]) == []


def test_run_bad_manifest_is_usage_error(home: Home, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent]\nid = 1\n")
    done = covenant(home, "run", str(bad), "x")
    assert done.returncode == 2 and "bad.toml" in done.stderr


def test_example_wordcount(home: Home) -> None:
    done = covenant(home, "run", str(EXAMPLES_DIR / "wordcount-py"), "the cat and the hat")
    assert done.returncode == 0, done.stderr
    assert "words: 5" in done.stdout


def test_example_calc(home: Home) -> None:
    require_tool("node")
    done = covenant(home, "run", str(EXAMPLES_DIR / "calc-node"), "what is 2 + 3 * 4")
    assert done.returncode == 0, done.stderr
    assert "14" in done.stdout


def test_example_search(home: Home) -> None:
    cargo = require_tool("cargo")
    manifest = EXAMPLES_DIR / "search-rs" / "Cargo.toml"
    subprocess.run([cargo, "build", "--quiet", "--release", "--offline", "--manifest-path", str(manifest)], check=True)
    done = covenant(home, "run", str(EXAMPLES_DIR / "search-rs"), "search supervisor", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["outcome"] == "ok" and record["network_enforced"] is True


def test_ctrl_c_of_run_aborts_and_leaves_no_process(home: Home, agent_reachable_dir: Path) -> None:
    """The agent sleeps, with a grandchild that left its process group: Ctrl-C ends both, and says Aborted!."""
    manifest = write_manifest(agent_reachable_dir)
    run = subprocess.Popen([*COVENANT, "--home", str(home.root), "run", str(manifest), "escape stay"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    entry = str(agent_reachable_dir / "fault.py")

    def agent_processes() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            if entry in (proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        return found

    try:
        deadline = time.monotonic() + 60
        while len(agent_processes()) < 3:  # the agent, the escapee's parent and the escapee
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        ctrl_c(run)
    deadline = time.monotonic() + 10
    while agent_processes():
        assert time.monotonic() < deadline, agent_processes()
        time.sleep(0.05)
