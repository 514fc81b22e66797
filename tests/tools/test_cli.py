"""`covenant agents show | check` name what a Rune agent's model is offered and what is unavailable here."""

from __future__ import annotations

import json

from click.testing import CliRunner

from covenant.cli.group import cli
from covenant.home import Home

from .conftest import write_package

WEB_SEARCH_REASON = 'needs [tools.web_search] url = "…" (a SearXNG-compatible JSON endpoint) in covenant.toml'
LOCATION_REASON = ("needs [tools.location] in covenant.toml (latitude and longitude, city, country, timezone: "
                   "what the operator knows; covenant never guesses a location)")


def _install(home: Home) -> None:
    write_package(
        home.root / "agents" / "mixed",
        "mixed",
        ["rune@system-time", "rune@location-get", "rune@web-search", "echo"],
        {"tools/echo.yaml": "name: echo\nruntime: process\nmodule: tools/echo.py\n", "tools/echo.py": "print('{}')\n"},
    )


def test_agents_show_lists_offered_and_unavailable_tools(home: Home) -> None:
    _install(home)
    result = CliRunner().invoke(cli, ["agents", "show", "mixed@local", "--json"])
    assert result.exit_code == 0, result.output
    tools = json.loads(result.stdout)["tools"]
    assert tools["offered"] == [
        {"entry": "rune@system-time", "name": "system-time", "action": "tool.system_time", "kind": "builtin"},
        {"entry": "echo", "name": "echo", "action": "tool.echo", "kind": "process"},
    ]
    assert tools["unavailable"] == [
        {"tool": "rune@location-get", "reason": LOCATION_REASON},
        {"tool": "rune@web-search", "reason": WEB_SEARCH_REASON},
    ]
    text = CliRunner().invoke(cli, ["agents", "show", "mixed@local"]).stdout
    assert "system-time (builtin rune@system-time, needs tool.system_time)" in text
    assert "rune@location-get: needs [tools.location] in covenant.toml" in text


def test_agents_check_warns_about_unavailable_tools_and_exits_0(home: Home) -> None:
    _install(home)
    result = CliRunner().invoke(cli, ["agents", "check", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["valid"] is True and report["problems"] == []
    messages = [w["message"] for w in report["warnings"]]
    assert any(m.startswith("tool rune@location-get is unavailable here (needs [tools.location]") for m in messages)
    assert any("rune@web-search" in m for m in messages)
    text = CliRunner().invoke(cli, ["agents", "check"])
    assert text.exit_code == 0
    assert "warning: tool rune@location-get is unavailable here" in text.stderr


def test_refuse_mode_rejects_an_agent_naming_an_unavailable_tool(home: Home) -> None:
    (home.root / "covenant.toml").write_text('[rune]\nunavailable_tools = "refuse"\n')
    write_package(home.root / "agents" / "searcher", "searcher", ["rune@system-time", "rune@web-search"])
    write_package(home.root / "agents" / "fine", "fine", ["rune@system-time", "git/git_status"])
    result = CliRunner().invoke(cli, ["agents", "check", "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["agents"] == ["fine@local"]  # an MCP entry is judged by the running daemon, never at load
    [problem] = report["problems"]
    assert problem["path"].endswith("agents/searcher/Runefile") and problem["field"] == "toolset[1]"
    assert problem["line"] == 7  # the line of `- rune@web-search`
    assert "rune@web-search is unavailable here (needs [tools.web_search]" in problem["message"]
    assert 'unavailable_tools = "refuse"' in problem["message"]
    shown = CliRunner().invoke(cli, ["agents", "show", "searcher@local"])
    assert shown.exit_code != 0


def test_warn_mode_is_the_default_and_loads_the_agent(home: Home) -> None:
    write_package(home.root / "agents" / "searcher", "searcher", ["rune@system-time", "rune@web-search"])
    result = CliRunner().invoke(cli, ["agents", "check", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["agents"] == ["searcher@local"]


def test_tools_list_names_every_tool_and_why_without_a_daemon(home: Home) -> None:
    _install(home)
    write_package(home.root / "agents" / "mcp", "mcp", ["time/get_current_time"])
    result = CliRunner().invoke(cli, ["tools", "list", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["daemon"] is False
    rows = {(r["agent"], r["entry"]): r for r in report["tools"]}
    assert rows[("mixed@local", "rune@system-time")] == {
        "agent": "mixed@local", "entry": "rune@system-time", "name": "system-time", "action": "tool.system_time",
        "kind": "builtin", "available": True, "reason": None,
    }
    assert rows[("mixed@local", "rune@web-search")]["available"] is False
    assert rows[("mixed@local", "echo")]["kind"] == "process"
    mcp = rows[("mcp@local", "time/get_current_time")]
    assert mcp["name"] == "time__get_current_time" and mcp["action"] == "tool.mcp.time.get_current_time"
    assert mcp["available"] is False and "no daemon answered" in mcp["reason"]
    one = CliRunner().invoke(cli, ["tools", "list", "mcp"])
    assert one.exit_code == 0 and "time__get_current_time" in one.stdout and "mixed" not in one.stdout
    assert CliRunner().invoke(cli, ["tools", "list", "nobody"]).exit_code == 6
