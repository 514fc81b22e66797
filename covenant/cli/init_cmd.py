"""``covenant init``: create the home, the daemon key and your identity."""

from __future__ import annotations

import click

from covenant.cli._common import CliContext, pass_cli, reports_errors
from covenant.homeinit import init_home
from covenant.keys import load_private_key, public_key_hex
from covenant.policy.identities import KnownIdentities, ensure_user_identity

__all__ = ["init"]


@click.command()
@click.option("--display", metavar="NAME", help="Display name for a new identity (default: $USER@<hostname>).")
@pass_cli
@reports_errors
def init(cli: CliContext, display: str | None) -> None:
    """Create the home's layout, its daemon key and your signing identity.

    Idempotent: what exists is kept, and no key is ever overwritten.
    """
    home = cli.home
    for line in init_home(home):
        click.echo(line)
    identity, created = ensure_user_identity(display)
    if created:
        click.echo(f"created your identity {identity.display}")
    KnownIdentities(home).add(identity.display, identity.pubkey)
    click.echo(f"home          {home.root}")
    click.echo(f"daemon key    {public_key_hex(load_private_key(home.daemon_key_path))}")
    click.echo(f"you           {identity.display} {identity.pubkey}")
    click.echo(f"next          put agents in {home.agents_dir}, then `covenant daemon`")
