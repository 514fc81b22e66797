"""This host's entry in ``COVENANT_HOSTS`` (design/fleet.md §3), and what goes into it.

``build`` is pure. The digests let ``covenant fleet status`` show drift between
hosts (grants and identities stay per host): each is the first 16 hex of a
SHA-256 over what is in force, not over the file, because each host signs its
grants with its own daemon key.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any

from covenant import __version__
from covenant.canonical import canonical_bytes
from covenant.clock import now_ms
from covenant.errors import CovenantError
from covenant.home import Home

__all__ = ["AgentView", "build", "Digests", "rune_concurrency"]

log = logging.getLogger("covenant.fleet")

AgentView = dict[str, Any]
"""``{"id", "keywords", "runtime", "capacity"}``: one agent as the fleet sees it."""


def build(host: str, agents: list[AgentView], in_flight: int, status: dict[str, Any],
          grants_digest: str | None, identities_digest: str | None) -> dict[str, Any]:
    """The host value: its agents, what runs, the audit head, the digests, now."""
    head = (status.get("audit") or {}).get("head") or {}
    return {
        "host": host,
        "agents": sorted(agents, key=lambda a: a["id"]),
        "in_flight": in_flight,
        "version": __version__,
        "audit_head": {"seq": head.get("seq"), "hash": head.get("hash")},
        "grants_digest": grants_digest,
        "identities_digest": identities_digest,
        "ts": now_ms(),
    }


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_bytes(value)).hexdigest()[:16]


class Digests:
    """The grants and identities digests of a home, recomputed only when their files change."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self._seen: tuple[Any, ...] | None = None
        self.grants: str | None = None
        self.identities: str | None = None

    @staticmethod
    def _stamp(path: os.PathLike[str]) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def refresh(self, daemon_pubkey: str | None) -> None:
        """Recompute when grants.toml, identities.toml or the daemon key changed (or a minute passed: expiries)."""
        stamp = (self._stamp(self.home.grants_path), self._stamp(self.home.known_identities_path), daemon_pubkey,
                 now_ms() // 60_000)
        if stamp == self._seen:
            return
        self._seen = stamp
        self.grants = self._grants(daemon_pubkey)
        self.identities = self._identities()

    def _grants(self, daemon_pubkey: str | None) -> str | None:
        if not daemon_pubkey:
            return None
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        from covenant.policy.grants import GrantStore

        try:
            key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(daemon_pubkey))
            grants = GrantStore(self.home.grants_path, key).load()
        except (CovenantError, ValueError) as exc:
            log.warning("grants digest not computed", extra={"error": str(exc)})
            return None
        now = now_ms()
        in_force = sorted(
            [g.issuer, g.action, g.expires_at] for g in grants.grants
            if g.unexpired(now) and not grants.revoked(g, g.action)
        )
        return _digest(in_force)

    def _identities(self) -> str | None:
        from covenant.policy.identities import KnownIdentities

        try:
            known = KnownIdentities(self.home).all()
        except CovenantError as exc:
            log.warning("identities digest not computed", extra={"error": str(exc)})
            return None
        return _digest(sorted(known.items()))


def rune_concurrency(manifest_path: str) -> int | None:
    """A Rune agent's ``runtime.concurrency_limit``, read from its package; None when it cannot be read."""
    from pathlib import Path

    from covenant.manifest.runefile import load_rune_package

    try:
        return load_rune_package(Path(manifest_path).parent).runefile.runtime.concurrency_limit
    except Exception as exc:  # a package the daemon loaded and that changed since: its daemon decides
        log.warning("Rune concurrency_limit not read; max_in_flight applies",
                    extra={"path": manifest_path, "error": f"{type(exc).__name__}: {exc}"})
        return None
