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

from covenant.policy.grants import GrantSet, GrantStore

__all__ = ["GrantsWatch", "GrantChanges"]


@dataclass(frozen=True)
class GrantChanges:
    added: list[tuple[str, str, int | None]]
    revoked: list[tuple[str, str, int | None]]


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _keys(grants: GrantSet) -> set[tuple[str, str, int | None]]:
    return {(g.issuer, g.action, g.expires_at) for g in grants.grants}


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
        before, after = _keys(self.current), _keys(fresh)
        self.current = fresh
        self._stamp = stamp
        return GrantChanges(added=sorted(after - before, key=str), revoked=sorted(before - after, key=str))
