"""Keep the daemon's grants and known identities in step with their files.

``covenant grant``, ``covenant revoke`` and ``covenant identity add`` edit the
files directly (they hold the daemon key), so the daemon re-reads a file
whenever its identity (inode, size, mtime) changes. The check is one ``stat``
per dispatch on the event loop (microseconds on a local file system); the
re-read itself verifies signatures and runs in a worker thread. A revoke
takes effect on the very next dispatch, with no polling delay and no reload.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from covenant.errors import CovenantError
from covenant.policy.grants import GrantSet, GrantStore
from covenant.policy.identities import KnownIdentities

__all__ = ["WatchedFile", "GrantsWatch", "GrantChanges", "diff_grants", "IdentityNames"]


class WatchedFile:
    """Tells whether a file changed since the last time it was asked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None | str = "unread"

    def _current(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def changed(self) -> bool:
        stamp = self._current()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        return True


@dataclass(frozen=True)
class GrantChanges:
    """What one re-read of grants.toml changed, as audit event data."""

    added: list[dict[str, Any]]
    revoked: list[dict[str, Any]]
    error: str | None = None


def _effective(grants: GrantSet) -> dict[tuple[str, str, int | None], dict[str, Any]]:
    return {
        (g.issuer, g.action, g.expires_at): {"issuer": g.issuer, "action": g.action, "expires_at": g.expires_at,
                                             "display": g.display}
        for g in grants.grants
        if not grants.revoked(g, g.action)
    }


def diff_grants(before: GrantSet, after: GrantSet) -> GrantChanges:
    """Grants that became effective, and grants that stopped being (revoked, or removed from the file)."""
    old, new = _effective(before), _effective(after)
    revoked_issuers = {r.issuer for r in after.revocations}
    revoked = [
        {**old[key], "how": "revoked" if key[0] in revoked_issuers else "removed"}
        for key in sorted(old.keys() - new.keys(), key=str)
    ]
    return GrantChanges(added=[new[k] for k in sorted(new.keys() - old.keys(), key=str)], revoked=revoked)


class GrantsWatch:
    """The current GrantSet; ``changed()`` on the loop, ``reload()`` in a thread."""

    def __init__(self, store: GrantStore) -> None:
        self._store = store
        self.file = WatchedFile(store.path)
        self.file.changed()
        self.current = GrantSet()
        self.load_error: str | None = None
        self.reload()  # a broken file at start means no grants (fail closed), reported in status

    def reload(self) -> GrantChanges:
        """Re-read the file. An unreadable file keeps the previous grants and says why."""
        try:
            fresh = self._store.load()
        except CovenantError as exc:
            self.load_error = exc.message
            return GrantChanges(added=[], revoked=[], error=exc.message)
        self.load_error = None
        changes = diff_grants(self.current, fresh)
        self.current = fresh
        return changes


class IdentityNames:
    """pubkey -> display name from the home's identities.toml, re-read when it changes.

    Decisions and grant hints name an issuer by what the operator recorded,
    never by the display name an intent claims for itself.
    """

    def __init__(self, known: KnownIdentities, path: Path) -> None:
        self._known = known
        self.file = WatchedFile(path)
        self._names: dict[str, str] = {}

    def reload(self) -> None:
        try:
            entries = self._known.all()
        except CovenantError:
            return  # keep the names we had; `covenant identity` reports the broken file
        names: dict[str, str] = {}
        for display, pubkey in entries.items():
            names.setdefault(pubkey, display)
        self._names = names

    def display_for(self, pubkey: str) -> str | None:
        return self._names.get(pubkey)
