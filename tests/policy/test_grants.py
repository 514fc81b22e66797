"""grants.toml: signatures, hand edits, comments, wildcards, expiry, revocation."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.home import Home
from covenant.keys import public_key_hex
from covenant.policy.errors import GrantError
from covenant.policy.grants import GrantStore, parse_duration_ms

from .conftest import NOW

HOUR = 3_600_000


def test_granted_action_is_active(store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str) -> None:
    made = store.add(daemon_key, alice_pub, ["tool.web_fetch"], None, "alice@box", now_ms=NOW)
    gs = store.load()
    assert gs.problems == ()
    assert gs.active_actions(alice_pub, NOW) == {"tool.web_fetch"}
    assert [g.id for g in gs.covering(alice_pub, "tool.web_fetch", NOW)] == [made[0].id]
    assert gs.active_actions(public_key_hex(Ed25519PrivateKey.generate()), NOW) == set()


def test_missing_file_is_empty(store: GrantStore, alice_pub: str) -> None:
    gs = store.load()
    assert gs.grants == () and gs.problems == ()


def test_action_added_by_hand_without_signature_does_not_grant(
    store: GrantStore, home: Home, alice_pub: str
) -> None:
    home.grants_path.write_text(
        f'[[grant]]\nissuer = "{alice_pub}"\naction = "tool.web_fetch"\ngranted_at = {NOW}\n'
    )
    gs = store.load()
    assert gs.active_actions(alice_pub, NOW) == set()
    assert len(gs.problems) == 1
    problem = gs.problems[0]
    assert problem.line == 1 and "missing signature" in problem.message
    assert str(home.grants_path) in str(problem)


def test_signature_copied_to_another_action_does_not_grant(
    store: GrantStore, daemon_key: Ed25519PrivateKey, home: Home, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.web_fetch"], None, None, now_ms=NOW)
    text = home.grants_path.read_text()
    signature = re.search(r'signature = "([0-9a-f]+)"', text)[1]  # type: ignore[index]
    home.grants_path.write_text(
        text + f'\n[[grant]]\nissuer = "{alice_pub}"\naction = "memory.write"\n'
        f'granted_at = {NOW}\nsignature = "{signature}"\n'
    )
    gs = store.load()
    assert gs.active_actions(alice_pub, NOW) == {"tool.web_fetch"}
    assert len(gs.problems) == 1
    assert "memory.write" in gs.problems[0].entry and "does not verify" in gs.problems[0].message
    assert gs.problems[0].line == text.count("\n") + 2


def test_action_changed_in_place_does_not_grant(
    store: GrantStore, daemon_key: Ed25519PrivateKey, home: Home, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.web_fetch"], None, None, now_ms=NOW)
    path = home.grants_path
    path.write_text(path.read_text().replace('"tool.web_fetch"', '"tool.*"'))
    gs = store.load()
    assert gs.active_actions(alice_pub, NOW) == set() and len(gs.problems) == 1


def test_expiry_extended_by_hand_does_not_grant(
    store: GrantStore, daemon_key: Ed25519PrivateKey, home: Home, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.x"], NOW + HOUR, None, now_ms=NOW)
    path = home.grants_path
    path.write_text(path.read_text().replace(f"expires_at = {NOW + HOUR}", f"expires_at = {NOW + 100 * HOUR}"))
    assert store.load().active_actions(alice_pub, NOW) == set()


def test_grant_signed_by_another_daemon_key_does_not_grant(home: Home, tmp_path: Path, alice_pub: str) -> None:
    other_key = Ed25519PrivateKey.generate()
    other = GrantStore(tmp_path / "other-grants.toml", other_key.public_key())
    other.add(other_key, alice_pub, ["tool.*"], None, None, now_ms=NOW)
    home.grants_path.write_text((tmp_path / "other-grants.toml").read_text())  # copied from another host
    ours = GrantStore(home.grants_path, Ed25519PrivateKey.generate().public_key())
    gs = ours.load()
    assert gs.active_actions(alice_pub, NOW) == set()
    assert len(gs.problems) == 1 and "daemon key" in gs.problems[0].message


def test_signing_with_a_foreign_key_is_refused(store: GrantStore, alice_pub: str) -> None:
    with pytest.raises(GrantError, match="not this home's daemon key"):
        store.add(Ed25519PrivateKey.generate(), alice_pub, ["tool.x"], None, None)


def test_malformed_entries_are_reported_not_honoured(store: GrantStore, home: Home, alice_pub: str) -> None:
    home.grants_path.write_text(
        'stray = 1\n\n[[grant]]\nissuer = "nope"\naction = "foo.bar"\ngranted_at = "yesterday"\n'
        f'signature = "{"0" * 128}"\ncolour = "red"\n'
    )
    gs = store.load()
    assert gs.grants == ()
    messages = " | ".join(str(p) for p in gs.problems)
    for fragment in ("stray", "issuer must be", "outside the reserved namespaces", "granted_at", "colour"):
        assert fragment in messages
    assert any(p.line == 3 for p in gs.problems)


def test_invalid_toml_raises_so_the_daemon_keeps_its_old_grants(store: GrantStore, home: Home) -> None:
    home.grants_path.write_text("[[grant]\n")
    with pytest.raises(GrantError, match="not valid TOML"):
        store.load()


def test_comments_and_order_survive_grant_and_revoke(
    store: GrantStore, daemon_key: Ed25519PrivateKey, home: Home, alice_pub: str
) -> None:
    bob = public_key_hex(Ed25519PrivateKey.generate())
    store.add(daemon_key, alice_pub, ["tool.a"], None, None, now_ms=NOW)
    store.add(daemon_key, bob, ["tool.b"], None, None, now_ms=NOW)
    path = home.grants_path
    text = path.read_text()
    text = "# operator: reviewed 2025-01-02 by kim\n" + text
    text = text.replace('action = "tool.a"', 'action = "tool.a"  # ticket OPS-12', 1)
    text = text.replace(f'[[grant]]\nissuer = "{bob}"', f'# bob is the on-call engineer\n[[grant]]\nissuer = "{bob}"')
    path.write_text(text)
    assert store.load().problems == ()

    store.add(daemon_key, alice_pub, ["memory.read"], None, None, now_ms=NOW + 1)
    store.add(daemon_key, alice_pub, ["tool.a"], NOW + HOUR, None, now_ms=NOW + 2)  # replaced in place
    store.revoke(daemon_key, bob, ["tool.b"], now_ms=NOW + 3)
    after = path.read_text()
    assert after.startswith("# operator: reviewed 2025-01-02 by kim\n")
    assert "# ticket OPS-12" in after
    assert "# bob is the on-call engineer" in after
    actions = [g["action"] for g in tomllib.loads(after)["grant"]]
    assert actions == ["tool.a", "memory.read"]  # original order kept, new grant appended
    gs = store.load()
    assert gs.problems == ()
    assert gs.active_actions(alice_pub, NOW + 10) == {"tool.a", "memory.read"}
    assert gs.active_actions(bob, NOW + 10) == set()


def test_wildcard_covers_its_namespace_only(store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str) -> None:
    store.add(daemon_key, alice_pub, ["tool.*"], None, None, now_ms=NOW)
    gs = store.load()
    assert gs.covering(alice_pub, "tool.x", NOW)
    assert gs.covering(alice_pub, "tool.web_fetch", NOW)
    assert not gs.covering(alice_pub, "memory.x", NOW)
    assert not gs.covering(alice_pub, "toolbox.x", NOW)


def test_expiry_is_honoured_at_check_time(store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str) -> None:
    store.add(daemon_key, alice_pub, ["tool.x"], NOW + HOUR, None, now_ms=NOW)
    gs = store.load()
    assert gs.covering(alice_pub, "tool.x", NOW + HOUR - 1)
    assert not gs.covering(alice_pub, "tool.x", NOW + HOUR)
    assert gs.status(gs.grants[0], NOW + HOUR) == "expired"


def test_revoke_takes_effect_on_next_load(store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str) -> None:
    made = store.add(daemon_key, alice_pub, ["tool.x", "memory.read"], None, None, now_ms=NOW)
    affected = store.revoke(daemon_key, alice_pub, ["tool.x"], now_ms=NOW + 1)
    assert affected == [made[0].id]
    gs = store.load()
    assert gs.active_actions(alice_pub, NOW + 2) == {"memory.read"}
    assert len(gs.revocations) == 1


def test_revocation_masks_a_restored_grant(
    store: GrantStore, daemon_key: Ed25519PrivateKey, home: Home, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.x"], None, None, now_ms=NOW)
    backup = home.grants_path.read_text()
    store.revoke(daemon_key, alice_pub, ["tool.x"], now_ms=NOW + 1)
    revocation = home.grants_path.read_text()
    home.grants_path.write_text(backup + "\n" + revocation)  # someone pastes the old, validly signed grant back
    gs = store.load()
    assert gs.problems == () and len(gs.grants) == 1
    assert not gs.covering(alice_pub, "tool.x", NOW + 2)
    assert gs.status(gs.grants[0], NOW + 2) == "revoked"


def test_revoking_a_narrow_action_takes_it_out_of_a_wildcard(
    store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.*"], None, None, now_ms=NOW)
    store.revoke(daemon_key, alice_pub, ["tool.web_fetch"], now_ms=NOW + 1)
    gs = store.load()
    assert not gs.covering(alice_pub, "tool.web_fetch", NOW + 2)
    assert gs.covering(alice_pub, "tool.search", NOW + 2)
    assert gs.masked_actions(gs.grants[0]) == ["tool.web_fetch"]


def test_revoking_a_wildcard_removes_narrow_grants(
    store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.a", "tool.b", "memory.read"], None, None, now_ms=NOW)
    store.revoke(daemon_key, alice_pub, ["tool.*"], now_ms=NOW + 1)
    gs = store.load()
    assert [g.action for g in gs.grants] == ["memory.read"]
    assert gs.active_actions(alice_pub, NOW + 2) == {"memory.read"}


def test_regrant_after_revoke_works_even_in_the_same_millisecond(
    store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.x"], None, None, now_ms=NOW)
    store.revoke(daemon_key, alice_pub, ["tool.x"], now_ms=NOW + 5)
    made = store.add(daemon_key, alice_pub, ["tool.x"], None, None, now_ms=NOW + 5)
    assert made[0].granted_at == NOW + 6
    gs = store.load()
    assert [g.id for g in gs.covering(alice_pub, "tool.x", NOW + 6)] == [made[0].id]


def test_revoke_is_dated_after_grants_even_if_the_clock_stepped_back(
    store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.x"], None, None, now_ms=NOW)
    store.add(daemon_key, alice_pub, ["tool.*"], None, None, now_ms=NOW)
    store.revoke(daemon_key, alice_pub, ["tool.x"], now_ms=NOW - HOUR)
    assert not store.load().covering(alice_pub, "tool.x", NOW + 1)


@pytest.mark.parametrize("action", ["foo.bar", "tool", "tool.", "*", "tool.**", "TOOL.x"])
def test_bad_actions_are_refused(store: GrantStore, daemon_key: Ed25519PrivateKey, alice_pub: str, action: str) -> None:
    with pytest.raises(GrantError):
        store.add(daemon_key, alice_pub, [action], None, None)


def test_file_is_replaced_atomically_and_lock_is_private(
    store: GrantStore, daemon_key: Ed25519PrivateKey, home: Home, alice_pub: str
) -> None:
    store.add(daemon_key, alice_pub, ["tool.x"], None, None)
    leftovers = [p.name for p in home.root.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    assert (home.root / ".grants.toml.lock").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(("text", "ms"), [("90m", 5_400_000), ("12h", 43_200_000), ("30d", 2_592_000_000),
                                          ("2w", 1_209_600_000), ("45s", 45_000)])
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "0d", "10", "1y", "-1d", "1.5h", "d"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(GrantError):
        parse_duration_ms(text)
