"""Which addresses ``rune@web-fetch`` may reach: public unicast only, unless ``[tools.web_fetch] allow`` says so;
and the host services of ``[isolation] host_allow`` (:func:`parse_host_service`).

A foundation module (no covenant imports): covenant.toml's validation parses these entries with it.

Refused by default: loopback, link-local (169.254.0.0/16 with the cloud
metadata address 169.254.169.254, fe80::/10), private (10/8, 172.16/12,
192.168/16, fc00::/7), shared address space (100.64/10), multicast,
unspecified, reserved, documentation and benchmarking ranges — everything
:attr:`ipaddress.IPv4Address.is_global` is false for. IPv4 addresses inside
IPv6 (``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4) are judged as IPv4.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

__all__ = ["AddressPolicy", "parse_allow_entry", "parse_host_service", "HOST_NAME"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62}))*\.?$")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def parse_allow_entry(entry: str) -> str | IPNetwork:
    """A host name (lower-cased) or a network; raise ValueError naming the entry otherwise."""
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        pass
    if HOST_NAME.match(entry):
        return entry.lower().rstrip(".")
    raise ValueError(f"{entry!r} is neither a host name nor an IP address or CIDR (e.g. 10.0.0.0/8)")


def parse_host_service(entry: str) -> tuple[IPAddress, int]:
    """``ADDRESS:PORT`` (``[v6]:PORT`` for IPv6) of ``[isolation] host_allow``; ValueError naming the entry."""
    address, sep, port = entry.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{entry!r} must be ADDRESS:PORT, e.g. 127.0.0.1:5432 or [::1]:5432")
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    try:
        return ipaddress.ip_address(address), int(port)
    except ValueError:
        raise ValueError(f"{entry!r}: {address!r} is not an IP address (a host service is named by its address)") from None


def _embedded_v4(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


@dataclass(frozen=True)
class AddressPolicy:
    """The allow list, parsed once."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_config(cls, allow: tuple[str, ...]) -> "AddressPolicy":
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in allow:
            parsed = parse_allow_entry(entry)
            if isinstance(parsed, str):
                hosts.add(parsed)
            else:
                networks.append(parsed)
        return cls(frozenset(hosts), tuple(networks))

    def host_allowed(self, host: str) -> bool:
        """Is this host name listed (then every address it resolves to is allowed)?"""
        return host.lower().rstrip(".") in self.hosts

    def listed(self, address: str) -> bool:
        """Is ``address`` inside a network of the allow list?"""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        judged = _embedded_v4(ip)
        return any(a.version == net.version and a in net for net in self.networks for a in (ip, judged))

    def refusal(self, address: str) -> str | None:
        """None when ``address`` may be reached; else why not."""
        if self.listed(address):
            return None
        judged = _embedded_v4(ipaddress.ip_address(address.split("%", 1)[0]))
        if judged.is_global and not judged.is_multicast:
            return None
        kind = (
            "loopback" if judged.is_loopback else "link-local" if judged.is_link_local
            else "private" if judged.is_private else "multicast" if judged.is_multicast else "special-purpose"
        )
        return f"{address} is a {kind} address"
