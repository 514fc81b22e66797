"""``covenant logs``: the daemon's recent log lines, or a live stream with -f."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import click

from covenant.cli._common import CliContext, daemon_client, echo, pass_cli, reports_errors
from covenant.cli._output import echo_json
from covenant.logs import format_logfmt

__all__ = ["logs"]


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
    query = {k: v for k, v in {"agent": agent, "level": level, "follow": "1" if follow else None}.items() if v}
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
