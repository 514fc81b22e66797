"""The click group behind ``covenant``: loads each subcommand's module only when it runs.

The command -> module table is :data:`covenant.cli.main._COMMANDS`.
"""

from __future__ import annotations

import importlib

import click

from covenant import __version__
from covenant.cli._common import CliContext
from covenant.cli.main import _COMMANDS

__all__ = ["LazyGroup", "cli"]


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target[0].split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, short) in _COMMANDS.items()])


@click.group(cls=LazyGroup)
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    envvar="COVENANT_HOME",
    help="The covenant home (default: $COVENANT_HOME, else ~/.covenant).",
)
@click.version_option(__version__, prog_name="covenant")
@click.pass_context
def cli(ctx: click.Context, home: str | None) -> None:
    """covenant: supervise agents under hard limits, with a signed audit trail.

    Exit codes of dispatch and run: 0 ok, 1 agent answered status error,
    2 usage or configuration error, 3 denied, 4 agent failed,
    5 daemon unreachable or shutting down, 6 no agent matched or ambiguous.
    """
    ctx.obj = CliContext.from_option(home)
