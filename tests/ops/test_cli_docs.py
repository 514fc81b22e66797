"""Every CLI flag the docs show exists, and every covenant.toml key the docs list exists (issue 16).

The other direction (every config key is documented, with its default) is
tests/ops/test_config_docs.py. Commands are found wherever the docs write
``covenant COMMAND …``, in code blocks and inline code, and in the README's
command synopsis; ``|`` separates alternatives on one line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
from pydantic import BaseModel

from covenant.cli.group import cli
from covenant.config import Config
from tests.conftest import REPO_ROOT

PAGES = sorted((REPO_ROOT / "docs").glob("*.md")) + [REPO_ROOT / "README.md"]
_FLAG = re.compile(r"^(--?[a-z][a-z0-9-]*)")
DELIBERATE_TYPOS = {"max_concurent"}  # configuration.md shows what a typo does
_CODE = re.compile(r"`([^`\n]+)`")


def _flags(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        if isinstance(param, click.Option):
            names.update(param.opts + param.secondary_opts)
    return names


def _command_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every code-block line and every inline code span."""
    found: list[tuple[int, str]] = []
    in_block = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            found.append((number, line.split("#", 1)[0] if " # " in line or line.startswith("#") else line))
        else:
            found += [(number, span) for span in _CODE.findall(line)]
    return found


def _resolve(words: list[str], group: click.Group, ctx: click.Context) -> tuple[click.Command | None, list[str]]:
    """The (sub)command the words name and the words after it, or None when they name none."""
    command = group.get_command(ctx, words[0]) if words else None
    if command is None:
        return None, words
    rest = words[1:]
    if isinstance(command, click.Group) and rest:
        sub = command.get_command(ctx, rest[0])
        if sub is not None:
            return sub, rest[1:]
    return command, rest


def _undocumented_flags(page: Path) -> list[str]:
    ctx = click.Context(cli)
    problems = []
    synopsis = page.name == "README.md"
    for number, line in _command_lines(page.read_text()):
        group_context: click.Group | None = None
        for segment in line.split(" | "):
            words = [w.strip("[](),;.`'\"…") for w in segment.split()]
            words = [w for w in words if w]
            if "covenant" in words:
                words = words[words.index("covenant") + 1:]
                if words[:1] == ["--home"]:
                    words = words[2:]
            elif not synopsis and group_context is None:
                continue
            command, rest = _resolve(words, cli, ctx)
            if command is None and group_context is not None and words:
                command, rest = group_context.get_command(ctx, words[0]), words[1:]
            if command is None:
                continue
            parent = cli.get_command(ctx, words[0])
            group_context = parent if isinstance(parent, click.Group) else group_context
            known = _flags(command) | {"--home", "--version"}
            for word in rest:
                flag = _FLAG.match(word)
                if flag and flag.group(1) not in known:
                    problems.append(f"{page.name}:{number}: `{command.name}` has no option {flag.group(1)} ({segment.strip()})")
    return problems


def test_every_documented_flag_exists() -> None:
    problems = [p for page in PAGES for p in _undocumented_flags(page)]
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_wrong_flag(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Run `covenant grants --everything`, then\n```\ncovenant agents check --fix\n```\n")
    assert [p.split(": ", 1)[1] for p in _undocumented_flags(page)] == [
        "`grants` has no option --everything (covenant grants --everything)",
        "`check` has no option --fix (covenant agents check --fix)",
    ]


def _command_paths(group: click.Group, ctx: click.Context, words: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The words of every command and subcommand under ``group`` (the group itself included)."""
    paths = [words]
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        paths += _command_paths(command, ctx, (*words, name)) if isinstance(command, click.Group) else [(*words, name)]
    return paths


def test_dash_h_is_help_on_every_command() -> None:
    """`-h` is `--help` on every command and subcommand (issue 39 item 5), in process and as the real program."""
    from click.testing import CliRunner

    paths = _command_paths(cli, click.Context(cli))
    assert ("audit", "tail") in paths and ("fleet", "status") in paths and ("sessions", "show") in paths
    runner = CliRunner()
    for words in paths:
        short = runner.invoke(cli, [*words, "-h"], prog_name="covenant")
        assert short.exit_code == 0 and short.output.startswith(f"Usage: {' '.join(('covenant', *words))} "), words
        assert short.output == runner.invoke(cli, [*words, "--help"], prog_name="covenant").output, words
        assert "-h, --help" in short.output, words
    for words in (("audit", "tail"), ("agents", "show"), ("--home", "/nonexistent", "sessions", "verify")):
        real = subprocess.run([sys.executable, "-m", "covenant", *words, "-h"], capture_output=True, text=True, timeout=60)
        assert real.returncode == 0 and real.stdout.startswith("Usage: covenant "), (words, real.stderr)


def _synopsis() -> dict[tuple[str, ...], set[str]]:
    """README's command synopsis: each command's words (a group's subcommand under both) -> the flags shown."""
    text = (REPO_ROOT / "README.md").read_text()
    block = text.split("## What you get\n\n```\n", 1)[1].split("```", 1)[0]
    ctx = click.Context(cli)
    shown: dict[tuple[str, ...], set[str]] = {}
    for line in block.splitlines()[1:]:  # the first is `covenant [--home PATH] COMMAND`
        segments = [segment.split() for segment in line.strip().split(" | ")]
        head = segments[0][0]
        is_group = isinstance(cli.get_command(ctx, head), click.Group)
        for words in segments:
            if is_group:
                words = words[1:] if words[0] == head else words
                path = (head, words[0]) if words and not words[0].startswith("[") else (head,)
            else:
                path = (words[0],)
            shown.setdefault(path, set()).update(m.group(1) for w in words if (m := _FLAG.match(w.strip("[]"))))
    return shown


def test_the_readme_shows_every_command_and_option() -> None:
    """Every command and subcommand, with every option it has, is in README's synopsis (issue 39 item 17)."""
    ctx = click.Context(cli)
    shown = _synopsis()
    problems = []
    for words in _command_paths(cli, ctx)[1:]:
        command = cli
        for word in words:
            command = command.get_command(ctx, word)
        if isinstance(command, click.Group) and not command.invoke_without_command:
            continue
        if words not in shown:
            problems.append(f"`covenant {' '.join(words)}` is not in README's command list")
            continue
        for option in (p for p in command.params if isinstance(p, click.Option) and not p.hidden):
            if not set(option.opts) & shown[words]:  # `-f` shows `-f, --follow`
                problems.append(f"`covenant {' '.join(words)}`: {max(option.opts, key=len)} is not shown")
    assert not problems, "\n".join(problems)


def _config_tables() -> dict[str, set[str]]:
    tables: dict[str, set[str]] = {"": set()}
    for name, field in Config.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            tables[name] = set(annotation.model_fields)
        else:
            tables[""].add(name)
    return tables


def test_every_documented_config_key_exists() -> None:
    """Each key row of a `[section]` table in any page, and each `[section] key` mention, is a real key."""
    tables = _config_tables()
    problems = []
    for page in PAGES:
        section: str | None = None
        in_block = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                in_block = not in_block
            if line.startswith("#") and not in_block:
                heading = re.match(r"#+ .*`\[(\w+)\]`", line)
                top = page.name == "configuration.md" and line == "## Top level"
                section = heading.group(1) if heading else ("" if top else None)
                continue
            row = re.match(r"\| `(\w+)` \|", line)
            if row and section is not None and section in tables and row.group(1) not in tables[section]:
                problems.append(f"{page.name}:{number}: [{section}] {row.group(1)} is not a covenant.toml key")
            for table, key in re.findall(r"`\[(\w+)\] (\w+)(?: = [^`]*)?`", line):
                if table in tables and key not in tables[table] and key not in DELIBERATE_TYPOS:
                    problems.append(f"{page.name}:{number}: [{table}] {key} is not a covenant.toml key")
    assert not problems, "\n".join(problems)


def test_the_error_code_table_matches_the_code() -> None:
    """docs/daemon.md's error table: each code the daemon answers with has its HTTP status and the exit code."""
    from covenant.audit.errors import AuditUnavailable
    from covenant.client import EXIT_BY_CODE
    from covenant.daemon.routing import AmbiguousRoute, NoAgent
    from covenant.daemon.scheduler import Overloaded, ShuttingDown
    from covenant.policy.errors import (
        BadIntent, BadSignature, BudgetExhausted, PolicyDenied, ReplayedIntent, StaleIntent,
    )

    answered = [AuditUnavailable, AmbiguousRoute, NoAgent, Overloaded, ShuttingDown, BadIntent, BadSignature,
                BudgetExhausted, PolicyDenied, ReplayedIntent, StaleIntent]
    table = (REPO_ROOT / "docs" / "daemon.md").read_text()
    documented = {code: (http, int(exit_code))
                  for code, http, exit_code in re.findall(r"^\| `(\w+)` \| ([\d/]+) \| (\d) \|", table, re.M)}
    problems = []
    for cls in answered:
        if cls.code not in documented:
            problems.append(f"{cls.code}: not in the error table")
            continue
        http, exit_code = documented[cls.code]
        if str(cls.http_status) not in http.split("/"):
            problems.append(f"{cls.code}: table says HTTP {http}, the daemon answers {cls.http_status}")
        if EXIT_BY_CODE.get(cls.code, 2) != exit_code:
            problems.append(f"{cls.code}: table says exit {exit_code}, the CLI exits {EXIT_BY_CODE.get(cls.code, 2)}")
    assert not problems, "\n".join(problems)
