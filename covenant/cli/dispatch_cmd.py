"""``covenant dispatch``: sign an intent with your identity and send it to the daemon.

Kept light on purpose: no trio, pydantic, psutil or yaml on this path.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import click

from covenant.cli._common import CliContext, fail, pass_cli, print_json, reports_errors
from covenant.client import DaemonClient
from covenant.errors import ExitCode
from covenant.policy.identities import ensure_user_identity
from covenant.policy.signing import new_intent, sign_intent

__all__ = ["dispatch"]


class _Spinner:
    """Elapsed time on stderr while waiting, only when stderr is a terminal."""

    FRAMES = "|/-\\"

    def __init__(self, label: str) -> None:
        self._label = label
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def __enter__(self) -> "_Spinner":
        if sys.stderr.isatty():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()

    def _spin(self) -> None:
        start = time.monotonic()
        frame = 0
        while not self._stop.wait(0.1):
            sys.stderr.write(f"\r{self.FRAMES[frame % 4]} {self._label} {time.monotonic() - start:5.1f}s")
            sys.stderr.flush()
            frame += 1


@click.command()
@click.argument("text")
@click.option("--agent", "agent_id", metavar="ID", help="Send to this agent instead of routing by keywords.")
@click.option("--priority", type=click.Choice(["low", "normal", "high"]), default="normal", show_default=True,
              help="Queue order when the daemon is saturated, and the agent's nice value.")
@click.option("--parent", metavar="ID", help="Intent id this one follows from (recorded, passed to the agent).")
@click.option("--json", "as_json", is_flag=True, help="Print the full outcome as JSON.")
@click.option("--dry-run", is_flag=True, help="Route and check policy, explain the decision, spawn nothing.")
@pass_cli
@reports_errors
def dispatch(cli: CliContext, text: str, agent_id: str | None, priority: str, parent: str | None,
             as_json: bool, dry_run: bool) -> None:
    """Sign TEXT with your identity and have the daemon run it.

    Exit codes: 0 ok, 1 the agent answered status error, 2 usage or
    configuration error, 3 denied (capability, budget, signature), 4 the agent
    failed (timeout, killed, crashed, protocol error, output too large),
    5 the daemon is unreachable, overloaded or shutting down, 6 no agent
    matched or the match is ambiguous.
    """
    identity, created = ensure_user_identity()
    if created:
        click.echo(f"covenant: created your identity {identity.display} ({identity.pubkey})", err=True)
    intent = new_intent(text, issuer_display=identity.display, issuer_pubkey=identity.pubkey,
                        agent=agent_id, priority=priority, parent=parent)
    body = {"intent": intent, "signature": sign_intent(identity.key, intent), "dry_run": dry_run}
    with DaemonClient(cli.home.socket_path) as client, _Spinner(agent_id or "dispatching"):
        outcome = client.request("POST", "/v1/dispatch", body)
    if as_json:
        print_json(outcome)
    if dry_run:
        if not as_json:
            click.echo(outcome["message"])
            click.echo(json.dumps(outcome["decision"], indent=2, sort_keys=True))
        sys.exit(ExitCode.OK)
    exit_code = int(outcome["exit_code"])
    if not as_json:
        if outcome["outcome"] in ("ok", "agent_error"):
            click.echo(outcome.get("text") or "")
        if exit_code != ExitCode.OK:
            detail = outcome.get("error") or outcome.get("text") or ""
            fail(f"{outcome['agent']}: {outcome['outcome']}: {detail}".rstrip(": "), exit_code)
    sys.exit(exit_code)
