"""Keep the daemon's grants in step with grants.toml.

``covenant grant`` and ``covenant revoke`` edit the file directly (they hold
the daemon key), so the daemon re-reads it whenever its identity (inode, size,
mtime) changes. The check is one ``stat`` per dispatch — a revoke takes effect
on the very next check, with no polling delay and no reload needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from covenant.policy.grants import GrantSet, GrantStore

__all__ = ["GrantsWatch", "GrantChanges", "diff_grants"]


@dataclass(frozen=True)
class GrantChanges:
    """What one re-read of grants.toml changed, as audit event data."""

    added: list[dict[str, Any]]
    revoked: list[dict[str, Any]]


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _effective(grants: GrantSet) -> dict[tuple[str, str, int | None], dict[str, Any]]:
    return {
        (g.issuer, g.action, g.expires_at): {"issuer": g.issuer, "action": g.action, "expires_at": g.expires_at,
                                             "display": g.display}
        for g in grants.grants
        if not grants.revoked(g, g.action)
    }


def diff_grants(before: GrantSet, after: GrantSet) -> GrantChanges:
    """Grants that became effective, and grants that stopped being (revoked or removed)."""
    old, new = _effective(before), _effective(after)
    revocations = {(r.issuer, r.action): r.revoked_at for r in after.revocations}
    revoked = []
    for key in sorted(old.keys() - new.keys(), key=str):
        issuer, action, _ = key
        how = "revoked" if (issuer, action) in revocations or any(
            r.issuer == issuer for r in after.revocations) else "removed"
        revoked.append({**old[key], "how": how})
    return GrantChanges(added=[new[k] for k in sorted(new.keys() - old.keys(), key=str)], revoked=revoked)


class GrantsWatch:
    """The current GrantSet, reloaded when grants.toml changes."""

    def __init__(self, store: GrantStore, path: Path) -> None:
        self._store = store
        self._path = path
        self._stamp = _stamp(path)
        self.current: GrantSet = store.load()

    def refresh(self, *, force: bool = False) -> GrantChanges | None:
        """Re-read grants.toml if it changed; return what changed, or None."""
        stamp = _stamp(self._path)
        if stamp == self._stamp and not force:
            return None
        fresh = self._store.load()
        changes = diff_grants(self.current, fresh)
        self.current = fresh
        self._stamp = stamp
        return changes
