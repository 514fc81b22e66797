"""Who is at the other end of a TCP connection, when that end is on this host.

The kernel lists every TCP socket of a network namespace in ``/proc/net/tcp`` and ``tcp6`` with the
uid that owns it; an accepted connection carries the uid of the listening socket it came from, and
it is listed as soon as the handshake completes (before the server even calls ``accept``). So once a
connection is made, the entry whose local end is our peer and whose remote end is us names the uid
of the server, with no window between a check and the use: the daemon asks this of a model
provider's connection before it sends the provider's key (:mod:`covenant.models.http`).
"""

from __future__ import annotations

import ipaddress
from typing import Any, Protocol

__all__ = ["local_peer_uid"]


class _Connected(Protocol):
    """A connected TCP socket: the standard library's or trio's."""

    def getsockname(self) -> Any: ...

    def getpeername(self) -> Any: ...

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def _hex_endpoint(address: str, port: int) -> tuple[str, str]:
    """``address:port`` as ``/proc/net/tcp{,6}`` writes them: each 32-bit word in host (little endian) order."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    raw = ip.packed
    words = [raw[i:i + 4][::-1].hex().upper() for i in range(0, len(raw), 4)]
    return "".join(words), f"{port:04X}"


def _forms(address: str, port: int) -> set[tuple[str, str]]:
    """Every way the kernel may list ``address:port``: an IPv4 address may sit in tcp6 as ``::ffff:a.b.c.d``."""
    forms = {_hex_endpoint(address, port)}
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        forms.add(_hex_endpoint(f"::ffff:{ip}", port))
    elif ip.ipv4_mapped is not None:
        forms.add(_hex_endpoint(str(ip.ipv4_mapped), port))
    return forms


def local_peer_uid(sock: _Connected) -> int | None:
    """The uid owning the other end of the connected TCP socket ``sock`` when it is on this host (in
    this network namespace); None when the peer is elsewhere. Blocking: reads two small /proc files."""
    ours = sock.getsockname()
    theirs = sock.getpeername()
    our_forms = _forms(ours[0], ours[1])
    their_forms = _forms(theirs[0], theirs[1])
    for table in _TABLES:
        try:
            with open(table) as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    if len(fields) < 8:
                        continue
                    local, remote = tuple(fields[1].split(":")), tuple(fields[2].split(":"))
                    if local in their_forms and remote in our_forms:
                        return int(fields[7])
        except FileNotFoundError:
            continue
    return None
