"""The ids of agents made at run time by ``rune@agent-spawn``: ``NAME@spawned-<key id>``.

The key id is the first :data:`KEY_ID_DIGITS` hex digits of the issuer's public key, written as covenant
writes keys everywhere (64 lowercase hex digits: ``covenant identity show``, grants.toml, the audit log's
``issuer``), so an operator sees whose helper an id is, and two issuers' helpers of one name are two
agents. The namespace ``spawned`` (and every ``spawned-…``) is reserved: no manifest in agents/ may use it.
"""

from __future__ import annotations

__all__ = ["KEY_ID_DIGITS", "SPAWNED_NAMESPACE", "is_spawned_id", "spawned_namespace"]

SPAWNED_NAMESPACE = "spawned"
KEY_ID_DIGITS = 12


def spawned_namespace(issuer_pubkey: str) -> str:
    """``spawned-<the first 12 hex digits of the issuer's key>``: the namespace of the issuer's spawned agents."""
    return f"{SPAWNED_NAMESPACE}-{issuer_pubkey[:KEY_ID_DIGITS].lower()}"


def is_spawned_id(agent_id: str) -> bool:
    """Is ``agent_id`` in the reserved namespace of spawned agents (``NAME@spawned`` or ``NAME@spawned-…``)?"""
    namespace = agent_id.partition("@")[2]
    return namespace == SPAWNED_NAMESPACE or namespace.startswith(f"{SPAWNED_NAMESPACE}-")
