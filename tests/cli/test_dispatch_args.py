"""The shared dispatch option table, and what the click-free parser accepts or leaves to click."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from covenant.cli.dispatch_args import DISPATCH_OPTIONS, DispatchArgs, parse_fast
from covenant.cli.group import cli


def test_click_command_is_built_from_the_table() -> None:
    command = cli.get_command(click.Context(cli), "dispatch")
    assert command is not None
    params = {p.name: p for p in command.params}
    assert [p.name for p in command.params] == ["text", *(o.dest for o in DISPATCH_OPTIONS)]
    for option in DISPATCH_OPTIONS:
        param = params[option.dest]
        assert isinstance(param, click.Option)
        assert param.opts == [option.flag]
        assert param.is_flag == option.is_flag
        assert param.help == option.help
        if option.choices is not None:
            assert isinstance(param.type, click.Choice) and tuple(param.type.choices) == option.choices
        if not option.is_flag:
            assert param.default == option.default


def args(**overrides: object) -> DispatchArgs:
    base: dict[str, object] = {"home": None, "text": "hi", "agent_id": None, "priority": "normal", "parent": None,
                               "as_json": False, "dry_run": False, "session_id": None, "stream": False}
    return DispatchArgs(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(("argv", "expected"), [
    (["dispatch", "hi"], args()),
    (["dispatch", "hi", "--agent", "a@b"], args(agent_id="a@b")),
    (["dispatch", "--priority", "high", "hi", "--json", "--dry-run"], args(priority="high", as_json=True, dry_run=True)),
    (["dispatch", "--parent", "p1", "hi", "--agent", "x", "--agent", "y"], args(parent="p1", agent_id="y")),
    (["--home", "/h", "dispatch", "hi there"], args(home="/h", text="hi there")),
    (["dispatch", "hi", "--session", "s-1.x", "--stream"], args(session_id="s-1.x", stream=True)),
])
def test_plain_invocations_take_the_fast_path(argv: list[str], expected: DispatchArgs) -> None:
    assert parse_fast(argv, {}) == expected


@pytest.mark.parametrize("argv", [
    [], ["status"], ["dispatch"], ["dispatch", ""], ["dispatch", "a", "b"], ["dispatch", "--help"],
    ["dispatch", "-h"], ["dispatch", "hi", "--help"], ["dispatch", "--", "hi"], ["dispatch", "-"],
    ["dispatch", "--agent=x", "hi"], ["dispatch", "--json=1", "hi"], ["dispatch", "--agent"],
    ["dispatch", "--agent", "--json", "hi"], ["dispatch", "--agent", "", "hi"], ["dispatch", "--priority", "HIGH", "hi"],
    ["dispatch", "--unknown", "hi"], ["dispatch", "-5"], ["--home"], ["--home", "h"], ["--home=h", "dispatch", "hi"],
    ["--version"], ["--help", "dispatch", "hi"], ["dispatch", "--home", "h", "hi"],
])
def test_anything_else_is_left_to_click(argv: list[str]) -> None:
    assert parse_fast(argv, {}) is None


def test_a_home_that_is_a_file_is_left_to_click(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert parse_fast(["--home", str(a_file), "dispatch", "hi"], {}) is None
    assert parse_fast(["dispatch", "hi"], {"COVENANT_HOME": str(a_file)}) is None
    assert parse_fast(["--home", str(tmp_path), "dispatch", "hi"], {}) == args(home=str(tmp_path))


def test_shell_completion_is_left_to_click() -> None:
    assert parse_fast(["dispatch", "hi"], {"_COVENANT_COMPLETE": "bash_complete"}) is None
