"""``covenant logs``: the daemon's recent log lines, or a live stream with -f; ``covenant tail AGENT``: one
agent's lines, the same ones ``logs --agent`` shows."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import click

from covenant.cli._common import CliContext, daemon_client, echo, pass_cli, reports_errors
from covenant.cli._output import echo_json
from covenant.logs import format_logfmt

__all__ = ["logs", "tail"]

TAIL_LINES = 10
"""``covenant tail`` prints this many lines without ``-n``."""


def _print_log(cli: CliContext, *, agent: str | None, level: str | None, follow: bool, as_json: bool,
               limit: int | None = None) -> None:
    """Print ``GET /v1/logs`` with these filters (``limit``: the last so many lines; the daemon's default
    otherwise) until it ends, or until Ctrl-C when following."""
    query = {k: v for k, v in {"agent": agent, "level": level, "follow": "1" if follow else None,
                               "limit": None if limit is None else str(limit)}.items() if v is not None}
    with daemon_client(cli.home) as client:
        try:
            for entry in client.events("/v1/logs?" + urlencode(query)):
                entry.pop("seq", None)
                if as_json:
                    echo_json(json.dumps(entry, sort_keys=True, ensure_ascii=False))
                else:
                    echo(format_logfmt(entry))
        except KeyboardInterrupt:
            pass


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new lines (survives reloads).")
@click.option("--agent", metavar="ID", help="Only lines about this agent: an id, or a bare name as `dispatch --agent` "
              "takes (exit 6 when it names no loaded or withdrawn agent).")
@click.option("--level", type=click.Choice(["debug", "info", "warning", "error"]), help="Minimum level.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line (JSON Lines) instead of logfmt.")
@pass_cli
@reports_errors
def logs(cli: CliContext, follow: bool, agent: str | None, level: str | None, as_json: bool) -> None:
    """Show the daemon's recent log lines (from GET /v1/logs).

    Each dispatch logs `dispatch started` and `dispatch finished` (intent,
    agent, issuer, outcome, ms), or `dispatch refused` with the reason.
    """
    _print_log(cli, agent=agent, level=level, follow=follow, as_json=as_json)


@click.command()
@click.argument("agent")
@click.option("-n", "lines", type=click.IntRange(0, 200), default=TAIL_LINES, show_default=True,
              help="How many of the agent's last lines to print (the daemon keeps the last 200).")
@click.option("-f", "--follow", is_flag=True, help="Then keep printing its new lines until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line (JSON Lines) instead of logfmt.")
@pass_cli
@reports_errors
def tail(cli: CliContext, agent: str, lines: int, follow: bool, as_json: bool) -> None:
    """Show AGENT's last log lines: the lines `covenant logs --agent AGENT` shows.

    Its stderr lines (`agent stderr`, `replica stderr`) and its dispatches'
    `dispatch started`, `finished` and `refused` lines. AGENT is an id or a
    bare name, as `dispatch --agent` takes (exit 6 when it names no loaded
    or withdrawn agent). Root, the daemon's uid and [isolation]
    operators_group only, as for `covenant logs`.
    """
    _print_log(cli, agent=agent, level=None, follow=follow, as_json=as_json, limit=lines)
