"""``covenant grant``, ``revoke`` and ``grants``: edit and list grants.toml with the daemon key.

These edit the file directly; a running daemon notices the change and re-reads it.
"""

from __future__ import annotations

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.cli._common import CliContext, echo, pass_cli, print_json, reports_errors, table_lines
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
@click.option("--json", "as_json", is_flag=True, help="Print the grants made as JSON: {grants: [...]}.")
@pass_cli
@reports_errors
def grant(cli: CliContext, issuer: str, actions: tuple[str, ...], expires: str | None, as_json: bool) -> None:
    """Grant ACTION... (e.g. tool.web_fetch, tool.*) to ISSUER (a public key or a known name)."""
    pubkey, display = _resolve(cli, issuer)
    now = now_ms()
    expires_at = None if expires is None else now + parse_duration_ms(expires)
    store, key = _store(cli)
    made = store.add(key, pubkey, actions, expires_at, display, now_ms=now)
    if as_json:
        print_json({"grants": [g.to_json() for g in made]})
        return
    who = display or pubkey
    for g in made:
        until = f" until {iso_ms(g.expires_at)}" if g.expires_at is not None else ""
        echo(f"granted {g.action} to {who}{until} (grant {g.id})")


@click.command()
@click.argument("issuer")
@click.argument("actions", metavar="ACTION...", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {issuer, display, actions, grants_affected}.")
@pass_cli
@reports_errors
def revoke(cli: CliContext, issuer: str, actions: tuple[str, ...], as_json: bool) -> None:
    """Revoke ACTION... from ISSUER; revocation wins over any earlier grant of it."""
    pubkey, display = _resolve(cli, issuer)
    store, key = _store(cli)
    affected = store.revoke(key, pubkey, actions)
    if as_json:
        print_json({"issuer": pubkey, "display": display, "actions": list(dict.fromkeys(actions)),
                    "grants_affected": list(affected)})
        return
    who = display or pubkey
    detail = f" (grants affected: {', '.join(affected)})" if affected else " (no grant held it; recorded anyway)"
    echo(f"revoked {', '.join(dict.fromkeys(actions))} from {who}{detail}")


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


def _grant_rows(listing: dict[str, object], everything: bool) -> list[tuple[str, ...]]:
    rows = []
    for row in listing["grants"]:  # type: ignore[attr-defined]
        if not everything and row["status"] != "active":
            continue
        expires = "never" if row["expires_at"] is None else iso_ms(row["expires_at"])
        within = f"revoked within: {', '.join(row['revoked_within'])}" if row["revoked_within"] else ""
        rows.append((row["id"], row["status"], row["display"] or "-", row["action"], iso_ms(row["granted_at"]),
                     expires, row["issuer"], within))
    return rows


@click.command()
@click.option("--all", "everything", is_flag=True, help="Also expired and revoked grants, and every revocation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {grants, revocations, problems} (always everything).")
@pass_cli
@reports_errors
def grants(cli: CliContext, everything: bool, as_json: bool) -> None:
    """List active grants in aligned columns (--all: also expired and revoked ones, and revocations).

    Reports every entry that does not verify on stderr and exits 1 if any.
    """
    store, _ = _store(cli)
    gs = store.load()
    listing = _listing(cli, gs)
    if as_json:
        print_json(listing)
    else:
        rows = _grant_rows(listing, everything)
        hidden = len(listing["grants"]) - len(rows)  # type: ignore[arg-type]
        if rows:
            headers = ("ID", "STATUS", "ISSUER", "ACTION", "GRANTED", "EXPIRES", "KEY", "NOTE")
            for line in table_lines(headers, rows):
                echo(line)
        else:
            echo(f"no {'' if everything else 'active '}grants in {store.path}")
        names = KnownIdentities(cli.home)
        revocations = listing["revocations"]
        if everything and revocations:
            echo("")
            table = [(names.display_for(r["issuer"]) or "-", r["action"], iso_ms(r["revoked_at"]), r["issuer"])
                     for r in revocations]  # type: ignore[attr-defined]
            for line in table_lines(("REVOKED FROM", "ACTION", "REVOKED AT", "KEY"), table):
                echo(line)
        elif not everything and (hidden or revocations):
            parts = [f"{hidden} expired or revoked grant(s)"] if hidden else []
            parts += [f"{len(revocations)} revocation(s)"] if revocations else []  # type: ignore[arg-type]
            echo(f"({' and '.join(parts)} not shown; `covenant grants --all` lists them)", err=True)
        for problem in gs.problems:
            echo(f"problem: {problem}", err=True)
    if gs.problems:
        raise SystemExit(1)
