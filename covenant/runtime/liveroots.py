"""Which agent uids have a live run: the guard of the per-uid sweep.

Concurrent dispatches of one agent share its uid, and a long-lived Rune
replica runs as its agent's uid for as long as it lives. Each of them is a
*live root* of that uid from its spawn until its own tree is gone. When the
last live root of a uid ends, every process still running as that uid is
an escape and is killed (:func:`covenant.runtime.uidkill.kill_uid`); while
another root lives, a process of the uid cannot be told apart from that
run's own (an emptied environment carries no marker), so it is kept until
the last one ends.

One registry per daemon: the runner and a replica supervisor share it.
Used from the trio thread only.
"""

from __future__ import annotations

__all__ = ["LiveRoots"]


class LiveRoots:
    """uid -> number of live roots running as it."""

    def __init__(self) -> None:
        self._count: dict[int, int] = {}

    def add(self, uid: int) -> None:
        """A run (dispatch or replica) of ``uid`` started."""
        self._count[uid] = self._count.get(uid, 0) + 1

    def remove(self, uid: int) -> bool:
        """A run of ``uid`` ended; True when it was the last one (sweep the uid now)."""
        left = self._count.get(uid, 0) - 1
        if left > 0:
            self._count[uid] = left
            return False
        self._count.pop(uid, None)
        return True

    def live(self, uid: int) -> bool:
        """Does ``uid`` have a live root?"""
        return uid in self._count

    def uids(self) -> set[int]:
        """Every uid with a live root."""
        return set(self._count)
