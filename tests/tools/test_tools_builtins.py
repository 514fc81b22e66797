"""`covenant tools list --builtins`: every built-in, as this host and covenant.toml offer it, or why not."""

from __future__ import annotations

import json

from click.testing import CliRunner

from covenant.cli.group import cli
from covenant.home import Home
from covenant.manifest.tools import BUILTIN_TOOLS
from covenant.tools.builtins import BUILTINS


def _builtins(home: Home) -> dict[str, dict]:
    result = CliRunner().invoke(cli, ["tools", "list", "--builtins", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["builtins"]
    assert [r["entry"] for r in rows] == sorted(BUILTIN_TOOLS)  # every built-in, once, in name order
    return {r["entry"]: r for r in rows}


def test_every_builtin_is_listed_offered_or_with_a_reason_covenant_toml_can_change(home: Home) -> None:
    assert CliRunner().invoke(cli, ["init", "--display", "t@test"]).exit_code == 0
    rows = _builtins(home)
    assert rows["rune@system-time"] == {"entry": "rune@system-time", "name": "system-time",
                                        "action": "tool.system_time", "available": True, "reason": None}
    assert all(r["available"] == (r["reason"] is None) for r in rows.values())
    assert all(r["reason"] for r in rows.values() if not r["available"])
    search = rows["rune@web-search"]
    assert not search["available"] and "[tools.web_search]" in search["reason"]

    with open(home.config_path, "a") as f:
        f.write('\n[tools.web_search]\nurl = "https://search.example/search"\n')
    assert _builtins(home)["rune@web-search"]["available"]

    text = CliRunner().invoke(cli, ["tools", "list", "--builtins"]).stdout
    assert text.splitlines()[0].split() == ["TOOL", "MODEL", "NAME", "CAPABILITY", "AVAILABLE"]
    assert any(line.startswith("rune@system-time ") and line.endswith(" yes") for line in text.splitlines())


def test_builtins_with_an_agent_is_a_usage_error(home: Home) -> None:
    result = CliRunner().invoke(cli, ["tools", "list", "chat", "--builtins"])
    assert result.exit_code == 2 and "give no AGENT" in result.output


def test_every_builtin_the_loader_accepts_is_implemented() -> None:
    """The catalogue looks built-ins up without a fallback: a name the loader accepts must have its tool."""
    assert set(BUILTINS) == BUILTIN_TOOLS
