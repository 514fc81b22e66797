"""The browser runner's copy of the address rules agrees with covenant.netpolicy's, address by address.

The runner runs as ``python -I`` under the agent's uid, without covenant's package on its path, so it
restates the rules of ``rune@web-fetch``; this holds the two copies to the same answers.
"""

from __future__ import annotations

import pytest

from covenant.netpolicy import AddressPolicy
from covenant.tools.browser_runner import Rules

ADDRESSES = [
    "127.0.0.1", "127.8.9.10", "10.0.0.1", "10.200.1.2", "172.16.5.4", "172.32.0.1", "192.168.1.1", "100.64.0.1",
    "169.254.169.254", "0.0.0.0", "224.0.0.1", "255.255.255.255", "192.0.2.1", "198.18.0.1", "8.8.8.8",
    "93.184.216.34", "::1", "::", "fe80::1", "fe80::1%eth0", "fc00::1", "fd12::3", "ff02::1", "2001:db8::1",
    "2606:4700::1111", "::ffff:127.0.0.1", "::ffff:8.8.8.8", "64:ff9b::a00:1", "64:ff9b::808:808",
    "2002:7f00:1::", "2002:808:808::",
]
ALLOW_LISTS = [[], ["10.0.0.0/8"], ["127.0.0.1"], ["fd00::/8", "192.168.0.0/16"], ["example.internal"], ["::1/128"]]


@pytest.mark.parametrize("allow", ALLOW_LISTS)
def test_the_runner_refuses_exactly_what_web_fetch_refuses(allow: list[str]) -> None:
    rules = Rules(allow, "full")
    policy = AddressPolicy.from_config(tuple(allow))
    for address in ADDRESSES:
        assert (rules._refusal(address) is None) == (policy.refusal(address) is None), (address, allow)
        assert rules._refusal(address) == policy.refusal(address), (address, allow)
    for host in ("example.internal", "EXAMPLE.internal.", "other.internal"):
        assert (host.lower().rstrip(".") in rules.hosts) == policy.host_allowed(host), (host, allow)
