"""Under a root daemon, process tools run as the agent's own unprivileged uid, like the agent.

Needs root (only then are agents given other uids): skipped with that reason
elsewhere; CI runs as root, where nothing here skips.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from covenant.config import Config, IsolationConfig, RuntimeConfig
from covenant.homeinit import init_home
from covenant.runtime.isolation import open_isolation
from covenant.runtime.liveroots import LiveRoots
from covenant.runtime.runner import Runner
from covenant.tools import ToolHost

from .conftest import Tools, write_package

PROBE = """\
import json, os, sys
json.load(sys.stdin)
def readable(path):
    try:
        open(path, "rb").close()
        return True
    except OSError:
        return False
home = sys.argv[0].split("/agents/")[0]
json.dump({"uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(),
           "daemon_key": readable(home + "/identity/daemon.key"),
           "memory": readable(home + "/state/memory/probe@local/memory.jsonl")}, sys.stdout)
"""


@pytest.fixture
async def isolated(tools: Tools) -> AsyncIterator[ToolHost]:
    if os.geteuid() != 0:
        pytest.skip("needs root: only a root daemon runs agents (and their tools) as other uids")
    init_home(tools.home)
    isolation = open_isolation(IsolationConfig(), tools.home.state_dir)
    assert isolation.enforced
    runtime = RuntimeConfig(python3="/usr/bin/python3", kill_grace_ms=500)
    config = Config(runtime=runtime)
    async with Runner.open(
        runtime, scratch_root=tools.home.state_dir / "scratch", isolation=isolation, live_roots=LiveRoots()
    ) as runner:
        yield ToolHost(tools.home, config, runner, tools.audit)


async def test_a_process_tool_runs_as_the_agents_uid_and_cannot_read_daemon_files(tools: Tools, isolated: ToolHost) -> None:
    agents = tools.home.root / "agents"
    agents.mkdir(mode=0o755, exist_ok=True)
    agent = write_package(
        agents / "probe",
        "probe",
        ["probe", "rune@memory-store"],
        {"tools/probe.yaml": "name: probe\nruntime: process\nmodule: tools/probe.py\n", "tools/probe.py": PROBE},
    )
    ctx = tools.ctx(agent, tools.grant("tool.probe", "tool.memory_store"))
    stored = await isolated.call(ctx, "memory-store", {"key": "k", "value": "v"})
    assert stored.ok, stored
    result = await isolated.call(ctx, "probe", {})
    assert result.ok, result
    seen = result.content
    assert seen["uid"] != 0 and seen["euid"] == seen["uid"] and seen["gid"] != 0
    assert seen["uid"] == isolated.services.runner.isolation.credentials_for(agent.id).uid
    assert seen["daemon_key"] is False and seen["memory"] is False
