"""Who may read which dispatch records (issue 12: per-user visibility).

A dispatch record keeps the uid of the local client that submitted it
(``DispatchRecord.peer_uid``, from SO_PEERCRED). A peer reads its own
records; root, the daemon's own uid and members of ``[isolation]
operators_group`` read all. Membership is looked up in the group database
(the peer's primary gid from SO_PEERCRED, its passwd primary group, or the
group's member list) at each request, so a change to /etc/group needs no
restart.
"""

from __future__ import annotations

import grp
import os
import pwd

import trio

from covenant.daemon.server import Peer
from covenant.runtime.outcome import DispatchRecord
from covenant.runtime.records import DispatchStore

__all__ = ["sees_every_record", "in_group", "VisibleRecords"]

_NO_UID = -1
"""Matches no record's peer_uid: what a client with unknown credentials may read."""


def in_group(uid: int, gid: int, group_name: str) -> bool:
    """True when the user ``uid`` (running with primary ``gid``) is a member of ``group_name``."""
    try:
        group = grp.getgrnam(group_name)
    except KeyError:
        return False  # a group that does not exist has no members
    if gid == group.gr_gid:
        return True
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    return user.pw_gid == group.gr_gid or user.pw_name in group.gr_mem


def sees_every_record(peer: Peer, operators_group: str | None) -> bool:
    """Root, the daemon's uid and the operators group read every record; anyone else only their own."""
    if peer.uid in (0, os.getuid()):
        return True
    return operators_group is not None and in_group(peer.uid, peer.gid, operators_group)


class VisibleRecords:
    """The dispatch store as each client may read it: its own records, or all of them (see the module)."""

    def __init__(self, store: DispatchStore, operators_group: str | None) -> None:
        self._store = store
        self._operators_group = operators_group

    def _reader_uid(self, viewer: Peer | None) -> int | None:
        """None when ``viewer`` may read every record, else the uid whose records it may read (blocking)."""
        if viewer is None:
            return _NO_UID  # credentials unknown: no record is theirs
        if sees_every_record(viewer, self._operators_group):
            return None
        return viewer.uid

    async def recent(self, limit: int, agent: str | None, viewer: Peer | None) -> list[DispatchRecord]:
        """The newest records ``viewer`` may read (its own; all for root, the daemon's uid, operators)."""

        def read() -> list[DispatchRecord]:
            return self._store.recent(limit, agent, peer_uid=self._reader_uid(viewer))

        return await trio.to_thread.run_sync(read)

    async def get(self, intent_id: str, viewer: Peer | None) -> DispatchRecord | None:
        """The record of ``intent_id`` when ``viewer`` may read it; None otherwise (as if absent)."""

        def read() -> DispatchRecord | None:
            record = self._store.get(intent_id)
            only = self._reader_uid(viewer)
            return record if record is not None and (only is None or record.peer_uid == only) else None

        return await trio.to_thread.run_sync(read)
