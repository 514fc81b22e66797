"""``covenant grant``, ``revoke`` and ``grants``: edit and list grants.toml with the daemon key.

These edit the file directly; a running daemon notices the change and re-reads it.
"""

from __future__ import annotations

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.cli._common import CliContext, pass_cli, print_json, reports_errors
from covenant.errors import CovenantError
from covenant.keys import load_private_key
from covenant.clock import iso_ms, now_ms
from covenant.policy.errors import UnknownIdentity
from covenant.policy.grants import GrantSet, GrantStore, parse_duration_ms
from covenant.policy.identities import KnownIdentities, load_user_identity

__all__ = ["grant", "revoke", "grants"]


def _resolve(cli: CliContext, issuer: str) -> tuple[str, str | None]:
    """(pubkey, display) for ISSUER: a public key, a name in the home, or your own identity's name."""
    known = KnownIdentities(cli.home)
    try:
        pubkey = known.resolve(issuer)
    except UnknownIdentity:
        me = _own_identity()
        if me is None or me[0] != issuer:
            raise
        return me[1], me[0]
    return pubkey, known.display_for(pubkey)


def _own_identity() -> tuple[str, str] | None:
    try:
        me = load_user_identity()
    except CovenantError:  # no usable identity here: only the home's names apply
        return None
    return me.display, me.pubkey


def _store(cli: CliContext) -> tuple[GrantStore, Ed25519PrivateKey]:
    """The home's grant store and the daemon key that signs (and verifies) its entries."""
    key = load_private_key(cli.home.daemon_key_path)
    return GrantStore(cli.home.grants_path, key.public_key()), key


@click.command()
@click.argument("issuer")
@click.argument("actions", metavar="ACTION...", nargs=-1, required=True)
@click.option("--expires", metavar="DURATION", help="Lifetime of the grant, e.g. 90m, 12h, 30d, 2w (default: none).")
@pass_cli
@reports_errors
def grant(cli: CliContext, issuer: str, actions: tuple[str, ...], expires: str | None) -> None:
    """Grant ACTION... (e.g. tool.web_fetch, tool.*) to ISSUER (a public key or a known name)."""
    pubkey, display = _resolve(cli, issuer)
    now = now_ms()
    expires_at = None if expires is None else now + parse_duration_ms(expires)
    store, key = _store(cli)
    made = store.add(key, pubkey, actions, expires_at, display, now_ms=now)
    who = display or pubkey
    for g in made:
        until = f" until {iso_ms(g.expires_at)}" if g.expires_at is not None else ""
        click.echo(f"granted {g.action} to {who}{until} (grant {g.id})")


@click.command()
@click.argument("issuer")
@click.argument("actions", metavar="ACTION...", nargs=-1, required=True)
@pass_cli
@reports_errors
def revoke(cli: CliContext, issuer: str, actions: tuple[str, ...]) -> None:
    """Revoke ACTION... from ISSUER; revocation wins over any earlier grant of it."""
    pubkey, display = _resolve(cli, issuer)
    store, key = _store(cli)
    affected = store.revoke(key, pubkey, actions)
    who = display or pubkey
    detail = f" (grants affected: {', '.join(affected)})" if affected else " (no grant held it; recorded anyway)"
    click.echo(f"revoked {', '.join(dict.fromkeys(actions))} from {who}{detail}")


def _listing(cli: CliContext, gs: GrantSet) -> dict[str, object]:
    names = KnownIdentities(cli.home)
    now = now_ms()
    rows = []
    for g in gs.grants:
        row = g.to_json()
        row["display"] = names.display_for(g.issuer) or g.display
        row["status"] = gs.status(g, now)
        row["revoked_within"] = gs.masked_actions(g)
        rows.append(row)
    return {
        "grants": rows,
        "revocations": [r.to_json() for r in gs.revocations],
        "problems": [p.to_json() | {"text": str(p)} for p in gs.problems],
    }


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_cli
@reports_errors
def grants(cli: CliContext, as_json: bool) -> None:
    """List grants; report every entry that does not verify (exit 1 if any)."""
    store, _ = _store(cli)
    gs = store.load()
    listing = _listing(cli, gs)
    if as_json:
        print_json(listing)
    else:
        rows = listing["grants"]
        if not rows:
            click.echo(f"no grants in {store.path}")
        for row in rows:  # type: ignore[union-attr]
            who = row["display"] or row["issuer"]
            expires = "never" if row["expires_at"] is None else iso_ms(row["expires_at"])
            extra = f"  (revoked within: {', '.join(row['revoked_within'])})" if row["revoked_within"] else ""
            click.echo(
                f"{row['id']}  {row['status']:<7}  {who}  {row['action']}  "
                f"granted {iso_ms(row['granted_at'])}  expires {expires}  key {row['issuer']}{extra}"
            )
        for problem in gs.problems:
            click.echo(f"problem: {problem}", err=True)
    if gs.problems:
        raise SystemExit(1)
