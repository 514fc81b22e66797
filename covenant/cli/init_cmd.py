"""``covenant init``: create the home, the daemon key and your identity."""

from __future__ import annotations

import click

from covenant.cli._common import CliContext, echo, pass_cli, print_json, reports_errors
from covenant.home import home_command
from covenant.homeinit import init_home
from covenant.keys import load_private_key, public_key_hex
from covenant.policy.identities import KnownIdentities, ensure_user_identity

__all__ = ["init"]


@click.command()
@click.option("--display", metavar="NAME", help="Display name for a new identity (default: $USER@<hostname>).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {home, created, daemon_pubkey, identity, agents_dir}.")
@pass_cli
@reports_errors
def init(cli: CliContext, display: str | None, as_json: bool) -> None:
    """Create the home's layout, its daemon key and your signing identity.

    Idempotent: what exists is kept, and no key is ever overwritten.
    """
    home = cli.home
    made = init_home(home)
    identity, created = ensure_user_identity(display)
    KnownIdentities(home).add(identity.display, identity.pubkey)
    daemon_pubkey = public_key_hex(load_private_key(home.daemon_key_path))
    if as_json:
        print_json({
            "home": str(home.root),
            "created": made,
            "daemon_pubkey": daemon_pubkey,
            "identity": {"display": identity.display, "pubkey": identity.pubkey, "created": created},
            "agents_dir": str(home.agents_dir),
        })
        return
    for line in made:
        echo(line)
    if created:
        echo(f"created your identity {identity.display}")
    echo(f"home          {home.root}")
    echo(f"daemon key    {daemon_pubkey}")
    echo(f"you           {identity.display} {identity.pubkey}")
    echo(f"next          put agents in {home.agents_dir}, then `{home_command(home.root, 'daemon')}`")
