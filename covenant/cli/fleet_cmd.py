"""``covenant fleet``: the per-host fleet process, and ``fleet status`` / ``fleet show`` (docs/fleet.md)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import click

from covenant.cli._common import CliContext, echo, fail, pass_cli, print_json, reports_errors, table_lines

__all__ = ["fleet"]


@click.group(invoke_without_command=True)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              help="Minimum log level (beats env COVENANT_LOG_LEVEL and covenant.toml).")
@click.option("--log-target", metavar="stderr|stdout|file:PATH",
              help="Where log lines go (beats env COVENANT_LOG_TARGET and covenant.toml).")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False),
              help="The daemon's control socket (default: env COVENANT_SOCKET, else `socket` in covenant.toml).")
@click.pass_context
@reports_errors
def fleet(ctx: click.Context, log_level: str | None, log_target: str | None, socket_path: str | None) -> None:
    """Run this host's fleet process in the foreground, or (with a subcommand) look at the fleet.

    The process pulls intents from NATS JetStream for the agents this home's
    daemon has loaded, up to their free capacity, runs each through the daemon's
    control socket and publishes the answer. It needs [fleet] servers in
    covenant.toml; it reconnects to NATS by itself. SIGTERM: stop pulling,
    finish what is in flight, exit 0.
    """
    if ctx.invoked_subcommand is not None:
        return
    from covenant.config import load_config
    from covenant.fleet.process import FleetProcess
    from covenant.logs import resolve_log_settings, setup_logging

    cli: CliContext = ctx.obj
    config = load_config(cli.home)
    config.fleet.require(cli.home.config_path)
    setup_logging(resolve_log_settings(log_level, log_target, os.environ, config.log))
    process = FleetProcess(cli.home, config, socket_path or str(cli.home.socket_path))
    sys.exit(asyncio.run(process.run()))


def _fleet_config(cli: CliContext) -> Any:
    from covenant.config import load_config

    return load_config(cli.home).fleet.require(cli.home.config_path)


def _ago(now_ms: int, then_ms: Any) -> str:
    if type(then_ms) is not int:
        return "-"
    seconds = max(0, (now_ms - then_ms) // 1000)
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def _short(digest: Any) -> str:
    return f"{digest[:8]}" if isinstance(digest, str) else "-"


@fleet.command()
@click.option("--json", "as_json", is_flag=True, help="Print the fleet's state as JSON.")
@pass_cli
@reports_errors
def status(cli: CliContext, as_json: bool) -> None:
    """Every host (up or last seen, agents, in flight, audit head, digests) and each agent's queue.

    Hosts that are up write their entry every 5 s; a host silent for 15 s is
    shown down, last seen at its last audit head. Grants and identities stay per
    host: differing digests are shown as drift. Exit 0, or 5 when NATS is unreachable.
    """
    from covenant.fleet.client import FleetClient

    async def read() -> dict[str, Any]:
        async with FleetClient(_fleet_config(cli)) as client:
            return await client.status()

    document = asyncio.run(read())
    if as_json:
        print_json(document)
        return
    now = document["now_ms"]
    rows = []
    for host in document["hosts"]:
        head = host.get("audit_head") or {}
        rows.append((str(host.get("host")), "up" if host["up"] else "DOWN", _ago(now, host.get("last_seen_ms")),
                     str(host.get("in_flight", "-")) if host["up"] else "-",
                     ", ".join(a.get("id", "?") for a in host.get("agents") or []) or "-",
                     f"seq {head.get('seq')}" if head.get("seq") is not None else "-",
                     _short(host.get("grants_digest")), _short(host.get("identities_digest")),
                     str(host.get("version") or "-")))
    if not rows:
        echo("no hosts: no fleet process has written to COVENANT_HOSTS (start `covenant fleet` on the hosts)")
    else:
        for line in table_lines(("HOST", "STATE", "LAST SEEN", "IN FLIGHT", "AGENTS", "AUDIT HEAD", "GRANTS",
                                 "IDENTITIES", "VERSION"), rows):
            echo(line)
    for key, what in (("grants_digest", "grants"), ("identities_digest", "identities"), ("version", "versions")):
        if document["drift"].get(key):
            echo(f"drift: the hosts' {what} differ (grants and identities stay per host: distribute them with your "
                 "configuration management)")
    queues = document["agents"]
    if queues:
        echo()
        for line in table_lines(("AGENT", "HOSTS", "PENDING", "IN FLIGHT"), [
            (q["agent"] or f"{q['consumer']} (no live host)", ", ".join(q["hosts"]) or "-", str(q["pending"]),
             str(q["in_flight"])) for q in queues
        ]):
            echo(line)


@fleet.command()
@click.argument("intent_id")
@click.option("--json", "as_json", is_flag=True, help="Print the answer message as JSON.")
@pass_cli
@reports_errors
def show(cli: CliContext, intent_id: str, as_json: bool) -> None:
    """Show the answer of INTENT_ID from COVENANT_RESULTS, whichever host ran it.

    Answers are kept 24 h. Exit 0 when there is one, 1 when there is none
    (not answered yet, or older), 5 when NATS is unreachable.
    """
    from covenant.fleet.client import FleetClient

    async def read() -> dict[str, Any] | None:
        async with FleetClient(_fleet_config(cli)) as client:
            return await client.answer_of(intent_id)

    answer = asyncio.run(read())
    if answer is None:
        fail(f"no answer for intent {intent_id} in COVENANT_RESULTS: not answered yet, or more than 24 h ago "
             "(the host that ran it keeps its dispatch record: `covenant --home H show ID` there)", 1)
    if as_json:
        print_json(answer)
        return
    error = answer.get("error")
    rows = [("intent", intent_id), ("host", str(answer.get("host"))), ("deliveries", str(answer.get("deliveries")))]
    if isinstance(error, dict):
        rows += [("refused", str(error.get("code"))), ("message", str(error.get("message")))]
    else:
        rows += [("agent", str(answer.get("agent"))), ("outcome", str(answer.get("outcome"))),
                 ("exit code", str(answer.get("exit_code"))), ("error", str(answer.get("error") or "-")),
                 ("from record", "yes" if answer.get("from_record") else "no")]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        echo(f"{key.ljust(width)}  {value}")
    if not isinstance(error, dict) and answer.get("text") is not None:
        echo()
        echo(str(answer.get("text")))
