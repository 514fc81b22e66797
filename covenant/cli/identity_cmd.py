"""``covenant identity``: your signing key, and other issuers' public keys in the home."""

from __future__ import annotations

import click

from covenant.cli._common import CliContext, echo, pass_cli, print_json, reports_errors
from covenant.policy.identities import KnownIdentities, init_user_identity, load_user_identity

__all__ = ["identity"]


@click.group()
def identity() -> None:
    """Manage your signing identity and the issuers this home knows by name."""


@identity.command("init")
@click.option("--display", metavar="NAME", help="Display name sent with your intents (default: $USER@<hostname>).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {display, pubkey, key_path}.")
@reports_errors
def init(display: str | None, as_json: bool) -> None:
    """Create your Ed25519 identity key (refuses to overwrite an existing one)."""
    me = init_user_identity(display)
    if as_json:
        print_json({"display": me.display, "pubkey": me.pubkey, "key_path": str(me.path)})
        return
    echo(f"created identity {me.display}")
    echo(f"public key: {me.pubkey}")
    echo(f"key file:   {me.path} (mode 0600)")


@identity.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@reports_errors
def show(as_json: bool) -> None:
    """Print your display name and public key."""
    me = load_user_identity()
    if as_json:
        print_json({"display": me.display, "pubkey": me.pubkey, "key_path": str(me.path)})
        return
    echo(f"display:    {me.display}")
    echo(f"public key: {me.pubkey}")
    echo(f"key file:   {me.path}")


@identity.command("add")
@click.argument("display")
@click.argument("pubkey")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {display, pubkey, path, added}.")
@pass_cli
@reports_errors
def add(cli: CliContext, display: str, pubkey: str, as_json: bool) -> None:
    """Record another issuer's PUBKEY under DISPLAY so operators can grant by name."""
    known = KnownIdentities(cli.home)
    added = known.add(display, pubkey)
    if as_json:
        print_json({"display": display, "pubkey": known.resolve(display), "path": str(known.path), "added": added})
    elif added:
        echo(f"added {display} = {known.resolve(display)} to {known.path}")
    else:
        echo(f"{display} is already recorded with that key in {known.path}")
