"""The capability check: required actions enforced, optional recorded, hint and audit record."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.canonical import canonical_bytes, is_canonical_line
from covenant.manifest.model import Capabilities
from covenant.policy.check import check_capabilities
from covenant.policy.errors import PolicyDenied
from covenant.policy.grants import GrantSet, GrantStore

from .conftest import NOW, make_agent


def test_allowed_when_every_required_action_is_granted(
    store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str
) -> None:
    made = store.add(daemon_key, alice_pub, ["tool.*", "memory.read"], None, None, now_ms=NOW)
    agent = make_agent(required=("tool.web_fetch", "memory.read"), optional=("memory.write",))
    decision = check_capabilities(alice_pub, agent, store.load(), NOW)
    assert decision.allowed and decision.missing == [] and decision.hint is None
    assert decision.granted == ["tool.web_fetch", "memory.read"]
    assert decision.matched_grants == {"tool.web_fetch": [made[0].id], "memory.read": [made[1].id]}
    assert decision.optional == ["memory.write"] and decision.optional_granted == []
    decision.raise_if_denied()


def test_denied_names_missing_actions_and_the_grant_command(
    store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["memory.read"], None, None, now_ms=NOW)
    agent = make_agent(required=("tool.web_fetch", "memory.read", "memory.write"))
    decision = check_capabilities(alice_pub, agent, store.load(), NOW, issuer_display="alice@box")
    assert not decision.allowed
    assert decision.missing == ["tool.web_fetch", "memory.write"]
    assert decision.granted == ["memory.read"]
    assert decision.hint == "covenant grant alice@box tool.web_fetch memory.write"
    with pytest.raises(PolicyDenied) as err:
        decision.raise_if_denied()
    exc = err.value
    assert exc.code == "capability_denied" and exc.http_status == 403 and exc.exit_code == 3
    assert "tool.web_fetch, memory.write" in exc.message and decision.hint in exc.message
    assert exc.details["missing"] == ["tool.web_fetch", "memory.write"]
    assert exc.details["hint"] == decision.hint


def test_hint_uses_the_pubkey_without_a_known_name_and_quotes_odd_names(alice_pub: str) -> None:
    agent = make_agent(required=("tool.x",))
    assert check_capabilities(alice_pub, agent, GrantSet(), NOW).hint == f"covenant grant {alice_pub} tool.x"
    hint = check_capabilities(alice_pub, agent, GrantSet(), NOW, issuer_display="ana m@box").hint
    assert hint == "covenant grant 'ana m@box' tool.x"


def test_agent_without_required_actions_is_allowed_for_anyone(alice_pub: str) -> None:
    decision = check_capabilities(alice_pub, make_agent(optional=("tool.x",)), GrantSet(), NOW)
    assert decision.allowed and decision.required == [] and decision.optional_granted == []


def test_optional_actions_are_recorded_not_enforced(
    store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.x"], None, None, now_ms=NOW)
    decision = check_capabilities(alice_pub, make_agent(optional=("tool.x", "memory.y")), store.load(), NOW)
    assert decision.allowed and decision.optional_granted == ["tool.x"]
    assert "tool.x" in decision.matched_grants


def test_expired_and_revoked_grants_do_not_count(
    store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.x"], NOW + 1000, None, now_ms=NOW)
    store.add(daemon_key, alice_pub, ["memory.read"], None, None, now_ms=NOW)
    agent = make_agent(required=("tool.x",))
    assert check_capabilities(alice_pub, agent, store.load(), NOW).allowed
    assert not check_capabilities(alice_pub, agent, store.load(), NOW + 1000).allowed
    store.revoke(daemon_key, alice_pub, ["memory.read"], now_ms=NOW + 1)
    assert not check_capabilities(alice_pub, make_agent(required=("memory.read",)), store.load(), NOW + 2).allowed


def test_grant_to_another_key_does_not_count(store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str) -> None:
    from covenant.keys import public_key_hex

    store.add(daemon_key, alice_pub, ["tool.x"], None, "alice@box", now_ms=NOW)
    mallory = public_key_hex(Ed25519PrivateKey.generate())
    assert not check_capabilities(mallory, make_agent(required=("tool.x",)), store.load(), NOW,
                                  issuer_display="alice@box").allowed


def test_wildcards_are_not_valid_in_manifests() -> None:
    from covenant.actions import action_problem

    assert action_problem("tool.*") is not None  # manifests use exact actions
    assert action_problem("tool.*", allow_wildcard=True) is None  # grants may use the namespace wildcard


def test_to_audit_is_canonical_json_without_floats(
    store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.x"], None, None, now_ms=NOW)
    for required in (("tool.x",), ("tool.x", "memory.y")):
        record = check_capabilities(alice_pub, make_agent(required=required), store.load(), NOW).to_audit()
        line = canonical_bytes(record)
        assert is_canonical_line(line)  # parse_strict refuses floats
        assert record["decision"] in ("allow", "deny")
        assert json.loads(line)["required"] == list(required)


def test_duplicate_required_actions_are_checked_once(alice_pub: str) -> None:
    agent = make_agent().model_copy(update={"capabilities": Capabilities(required=("tool.x", "tool.x"))})
    assert check_capabilities(alice_pub, agent, GrantSet(), NOW).missing == ["tool.x"]
