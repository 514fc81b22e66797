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

from covenant.daemon.server import Peer

__all__ = ["sees_every_record", "in_group"]


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
