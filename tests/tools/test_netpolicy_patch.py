"""The pure parts of the built-ins: web-fetch's address policy and apply-patch's diff parser."""

from __future__ import annotations

import pytest

from covenant.config import WebFetchToolConfig
from covenant.netpolicy import AddressPolicy
from covenant.tools.patch import PatchError, apply_hunks, parse_patch

REFUSED = ["127.0.0.1", "127.8.9.10", "::1", "169.254.169.254", "fe80::1", "10.0.0.1", "172.16.5.4", "192.168.1.1",
           "fd00::1", "100.64.0.1", "0.0.0.0", "::", "224.0.0.1", "ff02::1", "192.0.2.1", "198.18.0.1",
           "::ffff:127.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:7f00:1::1", "240.0.0.1"]


@pytest.mark.parametrize("address", REFUSED)
def test_special_addresses_are_refused_by_default(address: str) -> None:
    assert AddressPolicy.from_config(()).refusal(address) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "93.184.216.34"])
def test_public_addresses_pass(address: str) -> None:
    assert AddressPolicy.from_config(()).refusal(address) is None


def test_the_allow_list_opens_exactly_what_it_names() -> None:
    policy = AddressPolicy.from_config(("127.0.0.1/32", "Intranet.Example.", "10.1.0.0/16"))
    assert policy.refusal("127.0.0.1") is None and policy.refusal("::ffff:127.0.0.1") is None
    assert policy.refusal("127.0.0.2") is not None and policy.refusal("169.254.169.254") is not None
    assert policy.refusal("10.1.200.3") is None and policy.refusal("10.2.0.1") is not None
    assert policy.host_allowed("intranet.example") and not policy.host_allowed("example")


def test_a_bad_allow_entry_is_a_config_error_naming_it() -> None:
    with pytest.raises(ValueError, match="not a host"):
        WebFetchToolConfig(allow=("not a host!",))


def test_hunks_apply_where_they_moved_and_keep_missing_final_newlines() -> None:
    original = "".join(f"line {i}\n" for i in range(1, 11))
    patch = "--- a/f\n+++ b/f\n@@ -3,2 +3,2 @@\n line 5\n-line 6\n+LINE SIX\n@@ -9,2 +9,2 @@\n line 9\n-line 10\n+last\n\\ No newline at end of file\n"
    (file,) = parse_patch(patch)
    result = apply_hunks(original, file)
    assert "LINE SIX\n" in result and result.endswith("line 9\nlast") and "line 6" not in result


def test_broken_patches_name_the_problem() -> None:
    with pytest.raises(PatchError, match="not a unified diff"):
        parse_patch("hello")
    with pytest.raises(PatchError, match="cut short"):
        parse_patch("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n")
    (file,) = parse_patch("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-x\n+y\n")
    with pytest.raises(PatchError, match="does not match"):
        apply_hunks("z\n", file)
