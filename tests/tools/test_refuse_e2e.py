"""`[rune] unavailable_tools = "refuse"` in a real daemon: the agent is rejected at start and on reload."""

from __future__ import annotations

from pathlib import Path

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer
from tests.rune.conftest import add_rune_agent, configure


def test_the_daemon_rejects_an_agent_with_an_unavailable_tool_in_refuse_mode(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    configure(daemon, ("fake", fake_model), extra='[rune]\nunavailable_tools = "refuse"\n')
    add_rune_agent(daemon, "ok", toolset=("rune@system-time",))
    add_rune_agent(daemon, "imager", toolset=("rune@image-generate",))
    daemon.start()
    loaded = daemon.api("GET", "/v1/agents")
    assert [a["id"] for a in loaded["agents"]] == ["ok@local"]  # type: ignore[index]
    [problem] = loaded["problems"]  # type: ignore[index]
    assert "rune@image-generate is unavailable here" in problem["message"] and problem["field"] == "toolset[0]"
    result = daemon.cli("dispatch", "hi", "--agent", "imager@local", "--json")
    assert result.returncode == 6, result.stdout + result.stderr  # no such agent
    add_rune_agent(daemon, "ok", toolset=("rune@system-time", "rune@location-get"))
    reload = daemon.cli("reload")
    # The edit is refused; the agent keeps running its last valid version (only rune@system-time).
    assert reload.returncode == 1 and "snapshot: ok@local" in reload.stdout, reload.stdout + reload.stderr
    assert "toolset[1]: tool rune@location-get is unavailable here" in reload.stdout
    [agent] = daemon.api("GET", "/v1/agents")["agents"]  # type: ignore[index]
    assert agent["id"] == "ok@local" and agent["state"] == "snapshot", agent
    assert "location-get" not in (Path(agent["root"]) / "Runefile").read_text()
    assert daemon.stop() == 0
