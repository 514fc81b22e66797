"""Which agent uids have a live run: the guard of the per-uid sweeps.

Concurrent dispatches of one agent share its uid, and a long-lived Rune
replica (or stdio MCP server) runs as its agent's uid for as long as it
lives. Each of them is a *live root* of that uid from its spawn until its
own tree is gone; replicas and servers are *resident* roots, dispatches and
tool runs *passing* ones.

When the last live root of a uid ends, every process still running as that
uid is an escape and is killed (:func:`covenant.runtime.uidkill.kill_uid`).
When the last passing root ends and only resident ones are left, every
process of the uid that covenant adopted (it left the tree it was started
in) is killed on its own: a resident root never leaves processes outside its
tree, and no passing run is left that could own one. While a passing root
lives, a process of the uid cannot be told apart from that run's own (an
emptied environment carries no marker), so it is kept until then.

One registry per daemon: the runner and a replica supervisor share it.
Used from the trio thread only.
"""

from __future__ import annotations

__all__ = ["LiveRoots"]


class LiveRoots:
    """uid -> number of live roots running as it, and how many of them are passing."""

    def __init__(self) -> None:
        self._count: dict[int, int] = {}
        self._passing: dict[int, int] = {}

    def add(self, uid: int, *, resident: bool = False) -> None:
        """A run (dispatch, tool run, replica or MCP server) of ``uid`` started."""
        self._count[uid] = self._count.get(uid, 0) + 1
        if not resident:
            self._passing[uid] = self._passing.get(uid, 0) + 1

    def remove(self, uid: int, *, resident: bool = False) -> None:
        """A run of ``uid`` ended (``resident`` as it was added)."""
        _decrement(self._count, uid)
        if not resident:
            _decrement(self._passing, uid)

    def live(self, uid: int) -> bool:
        """Does ``uid`` have a live root?"""
        return uid in self._count

    def passing(self, uid: int) -> bool:
        """Does ``uid`` have a live dispatch or tool run?"""
        return uid in self._passing

    def uids(self) -> set[int]:
        """Every uid with a live root."""
        return set(self._count)


def _decrement(counts: dict[int, int], uid: int) -> None:
    left = counts.get(uid, 0) - 1
    if left > 0:
        counts[uid] = left
    else:
        counts.pop(uid, None)
