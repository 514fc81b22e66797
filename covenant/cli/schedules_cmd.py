"""``covenant schedules``: the daemon's schedules with their next and last runs."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from covenant.cli._common import CliContext, daemon_client, echo, pass_cli, print_json, reports_errors

__all__ = ["schedules"]


def _when(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print {\"schedules\": [...]} as JSON (times in ms since the epoch).")
@pass_cli
@reports_errors
def schedules(cli: CliContext, as_json: bool) -> None:
    """List the [[schedules]] of covenant.toml with their next and last runs (UTC).

    Exit 0 when the daemon answers, 5 when it does not.
    """
    with daemon_client(cli.home, timeout=10) as client:
        doc = client.request("GET", "/v1/schedules")
    if as_json:
        print_json(doc)
        return
    if not doc["schedules"]:
        echo("no schedules (add [[schedules]] to covenant.toml; docs/triggers.md)")
        return
    echo(f"{'NAME':<20} {'AGENT':<24} {'ISSUER':<20} {'WHEN':<16} {'NEXT':<21} LAST")
    for s in doc["schedules"]:
        when = f"every {s['every']}" if s["every"] else s["cron"]
        echo(f"{s['name']:<20} {s['agent']:<24} {s['issuer']:<20} {when:<16} {_when(s['next_ms']):<21} "
                   f"{_when(s['last_ms'])}")
