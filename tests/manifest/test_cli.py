"""`covenant agents list | show | check`: exit codes and output, in-process and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from click.testing import CliRunner

from covenant.cli.group import cli
from covenant.home import Home
from tests.conftest import REPO_ROOT
from tests.manifest.helpers import VALID_TOML, write_agent, write_rune


def _populate(home: Home) -> Path:
    agents = home.root / "agents"
    write_agent(agents, VALID_TOML, filename="demo.toml")
    write_rune(agents / "helper")
    return agents


def _run(*args: str) -> "object":
    return CliRunner().invoke(cli, list(args))


def test_list_json_is_stable(home: Home) -> None:
    _populate(home)
    result = _run("agents", "list", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [a["id"] for a in data["agents"]] == ["demo@local", "helper@local"]
    assert data["problems"] == []
    assert data["agents"][1]["runtime"] == "rune" and data["agents"][1]["entry"] is None
    assert _run("agents", "list", "--json").stdout == result.stdout


def test_list_plain_table_and_problem_note(home: Home) -> None:
    agents = _populate(home)
    (agents / "bad.toml").write_text("[agent\n")
    result = _run("agents", "list")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "RUNTIME", "VERSION", "REQUIRES", "KEYWORDS", "MANIFEST"]
    assert lines[1].startswith("demo@local") and lines[2].startswith("helper@local")
    assert "1 manifest problem(s)" in result.stderr


def test_show_by_id_and_bare_name(home: Home) -> None:
    _populate(home)
    result = _run("agents", "show", "demo", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["resources"]["memory_mb"] == 64
    text = _run("agents", "show", "helper@local")
    assert text.exit_code == 0 and "runtime:" in text.stdout and "tool.web_fetch" in text.stdout


def test_show_unknown_agent_exits_6(home: Home) -> None:
    _populate(home)
    result = _run("agents", "show", "ghost@local")
    assert result.exit_code == 6 and "no agent with id 'ghost@local' is loaded" in result.stderr
    assert "loaded: demo@local, helper@local" in result.stderr


def test_check_home_all_valid_exits_0(home: Home) -> None:
    _populate(home)
    result = _run("agents", "check")
    assert result.exit_code == 0 and result.stdout == ""
    assert "2 manifest(s): 2 valid, 0 rejected, 0 problem(s)" in result.stderr


def test_check_reports_one_line_per_problem_and_exits_1(home: Home) -> None:
    agents = _populate(home)
    bad = write_agent(agents / "bad", VALID_TOML.replace("memory_mb       = 64", 'memory_mb = "64"').replace('"demo@local"', '"bad@local"'))
    result = _run("agents", "check")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [f"{bad}:14: resources.memory_mb: must be an integer, got string '64' (write it without quotes)"]


def test_check_paths_and_missing_agents_dir(home: Home, tmp_path: Path) -> None:
    assert _run("agents", "check").exit_code == 1  # the home has no agents folder yet
    write_rune(tmp_path / "pkg")
    assert _run("agents", "check", str(tmp_path / "pkg")).exit_code == 0
    missing = _run("agents", "check", str(tmp_path / "nope.toml"))
    assert missing.exit_code == 1 and missing.stdout.strip() == f"{tmp_path / 'nope.toml'}: does not exist"


def test_check_json_and_warnings(home: Home) -> None:
    agents = home.root / "agents"
    write_agent(agents, VALID_TOML.replace('"demo@local"', '"demo"'), filename="demo.toml")
    result = _run("agents", "check", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["valid"] is True and data["agents"] == ["demo@local"]
    assert "demo@local" in data["warnings"][0]["message"]


def test_check_as_a_real_subprocess(home: Home) -> None:
    agents = _populate(home)
    (agents / "broken.toml").write_text('[agent]\nid = "x@local"\n')
    proc = subprocess.run(
        [str(REPO_ROOT / ".venv" / "bin" / "covenant"), "--home", str(home.root), "agents", "check"],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=60,
    )
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith(f"{agents / 'broken.toml'}:") for line in lines)
    assert {line.split(": ")[1] for line in lines} == {"agent.name", "agent.version", "agent.runtime", "agent.entry"}
