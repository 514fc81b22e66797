"""Real Rune packages written by others (shared/corpus/rune-examples) load unchanged.

The whole corpus is copied into a temp home's agents/ as it is: READMEs,
LICENSE, rune-compose.yml and channels.yaml beside the packages, a workflow
folder (multi-agent/) with its packages one level below.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from covenant.home import Home
from covenant.manifest.registry import scan_agents
from tests.conftest import rune_examples
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401  (the fixture)

CORPUS_AGENTS = {
    "chat@local",
    "code-assistant@local",
    "sentiment-agent@local",
    "mcp-agent@local",
    "memory-agent@local",
    "scheduled-reporter@local",
    "web-researcher@local",
    "router@local",
    "researcher@local",
    "analyst@local",
}
WORKFLOW_AGENT = "research-and-analyse@local"
IGNORED = {"LICENSE", "SOURCE.md", "readme.md", "README.md", "rune-compose.yml", "channels.yaml"}


@pytest.fixture
def corpus_home(home: Home) -> Home:
    agents = home.root / "agents"
    shutil.copytree(rune_examples(), agents)
    for folder, dirs, files in os.walk(agents):
        for name in (*dirs, *files):
            os.chmod(os.path.join(folder, name), 0o755 if name in dirs else 0o644)
    os.chmod(agents, 0o755)
    return home


def test_every_corpus_package_loads_unchanged(corpus_home: Home) -> None:
    registry = scan_agents(corpus_home.root / "agents")
    assert registry.problems == []
    assert set(registry.agents) == CORPUS_AGENTS | {WORKFLOW_AGENT}
    assert {p.path.name for p in registry.notes} == IGNORED
    assert all(n.message.startswith("info: ignored: ") for n in registry.notes)

    mcp = registry.rune_packages["mcp-agent@local"]
    assert [s.name for s in mcp.runefile.mcp_servers] == ["filesystem", "github"]
    assert mcp.runefile.mcp_servers[1].headers == {"Authorization": "Bearer ${GITHUB_TOKEN}"}  # not resolved at load
    assert "tool.mcp.github.create_issue" in registry.agents["mcp-agent@local"].capabilities.required

    router = registry.rune_packages["router@local"]
    assert router.tools["researcher"].runtime == "agent"
    assert router.tools["analyst"].agent_ref == "local://analyst"
    assert registry.agents["router@local"].capabilities.required == ("tool.researcher", "tool.analyst")

    flow = registry.agents[WORKFLOW_AGENT]
    assert flow.runtime == "workflow" and flow.manifest_path.name == "workflow.yaml"
    assert registry.workflows[WORKFLOW_AGENT].workflow.order() == ("researcher", "analyst")
    assert registry.rune_packages["sentiment-agent@local"].tools["analyse_sentiment"].module == "tools/analyse_sentiment.py"


def _covenant(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COVENANT_HOME": str(home.root), "COVENANT_SOCKET": str(home.root / "no-daemon.sock")}
    return subprocess.run([sys.executable, "-m", "covenant", *args], env=env, capture_output=True, text=True, timeout=120)


def test_agents_check_on_the_corpus_exits_0_with_info_notes(corpus_home: Home) -> None:
    plain = _covenant(corpus_home, "agents", "check")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert plain.stdout == ""  # problems go to stdout: there are none
    assert "info: ignored" in plain.stderr and "0 problem(s)" in plain.stderr

    checked = _covenant(corpus_home, "agents", "check", "--json")
    assert checked.returncode == 0
    data = json.loads(checked.stdout)
    assert data["valid"] is True and data["problems"] == []
    assert set(data["agents"]) == CORPUS_AGENTS | {WORKFLOW_AGENT}
    assert {Path(n["path"]).name for n in data["notes"]} == IGNORED

    folder = _covenant(corpus_home, "agents", "check", str(corpus_home.root / "agents" / "multi-agent"), "--json")
    assert folder.returncode == 0, folder.stdout
    assert set(json.loads(folder.stdout)["agents"]) == {WORKFLOW_AGENT, "router@local", "researcher@local", "analyst@local"}


def test_a_workflow_agent_run_fails_clearly_until_workflows_are_built(corpus_home: Home) -> None:
    result = _covenant(corpus_home, "run", str(corpus_home.root / "agents" / "multi-agent"), "a topic", "--json")
    assert result.returncode == 4, result.stdout + result.stderr
    record = json.loads(result.stdout)
    assert record["agent_id"] == WORKFLOW_AGENT
    assert record["outcome"] == "workflow_not_supported" and "workflow" in record["error"]
    assert record["pid"] is None


def test_the_daemon_serves_the_corpus_and_plans_its_workflow(daemon: DaemonProcess) -> None:
    agents = daemon.home / "agents"
    shutil.rmtree(agents)
    shutil.copytree(rune_examples(), agents)
    subprocess.run(["chmod", "-R", "go-w", str(agents)], check=True)
    daemon.start()
    loaded = daemon.api("GET", "/v1/agents")
    assert {a["id"] for a in loaded["agents"]} == CORPUS_AGENTS | {WORKFLOW_AGENT}
    assert loaded["problems"] == [] and {Path(n["path"]).name for n in loaded["notes"]} == IGNORED
    checked = daemon.cli("agents", "check")
    assert checked.returncode == 0 and "info: ignored" in checked.stderr, checked.stdout + checked.stderr

    result = daemon.cli("dispatch", "a topic", "--agent", WORKFLOW_AGENT, "--dry-run", "--json")
    assert result.returncode == 3, result.stdout + result.stderr  # nothing granted: every step is denied
    plan = json.loads(result.stdout)["error"]["workflow"]
    assert [[s["agent"] for s in wave] for wave in plan["waves"]] == [["researcher@local"], ["analyst@local"]]
    assert plan["output_step"] == "{{ steps.analyst.output }}" and "tool.shell_exec" in plan["capabilities"]
    assert plan["denied"] == ["researcher", "analyst"]
    assert daemon.stop() == 0
