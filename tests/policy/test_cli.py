"""`covenant identity`, `grant`, `revoke`, `grants` as real subprocesses against a temp home."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.home import Home, user_identity_path
from covenant.keys import create_key_file, load_private_key, public_key_hex
from covenant.policy.grants import GrantStore

from ..conftest import REPO_ROOT

COVENANT = str(REPO_ROOT / ".venv" / "bin" / "covenant")


def covenant(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COVENANT, *args], capture_output=True, text=True, env=os.environ.copy(), timeout=60)


@pytest.fixture
def daemon_home(home: Home) -> Home:
    create_key_file(home.daemon_key_path)
    return home


def test_identity_init_show_and_refuse_overwrite(home: Home) -> None:
    first = covenant("identity", "init", "--display", "ana@box")
    assert first.returncode == 0, first.stderr
    shown = covenant("identity", "show", "--json")
    data = json.loads(shown.stdout)
    assert data["display"] == "ana@box" and len(data["pubkey"]) == 64
    assert data["pubkey"] in first.stdout and data["key_path"] == str(user_identity_path())
    again = covenant("identity", "init")
    assert again.returncode == 2
    assert "refusing to overwrite" in again.stderr and str(user_identity_path()) in again.stderr
    assert json.loads(covenant("identity", "show", "--json").stdout)["pubkey"] == data["pubkey"]
    plain = covenant("identity", "show")
    assert "ana@box" in plain.stdout and data["pubkey"] in plain.stdout


def test_identity_show_without_identity_fails_with_advice(home: Home) -> None:
    result = covenant("identity", "show")
    assert result.returncode == 2 and "covenant identity init" in result.stderr


def test_grant_by_name_check_list_revoke(daemon_home: Home) -> None:
    bob = public_key_hex(Ed25519PrivateKey.generate())
    added = covenant("identity", "add", "bob@lap", bob)
    assert added.returncode == 0, added.stderr
    granted = covenant("grant", "bob@lap", "tool.*", "memory.read", "--expires", "30d")
    assert granted.returncode == 0, granted.stderr
    assert "granted tool.* to bob@lap" in granted.stdout and "until" in granted.stdout

    listing = covenant("grants", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)["grants"]
    assert [(r["display"], r["action"], r["status"]) for r in rows] == [
        ("bob@lap", "tool.*", "active"),
        ("bob@lap", "memory.read", "active"),
    ]
    assert all(r["issuer"] == bob and r["expires_at"] for r in rows)

    revoked = covenant("revoke", "bob@lap", "memory.read")
    assert revoked.returncode == 0, revoked.stderr
    store = GrantStore(daemon_home.grants_path, load_private_key(daemon_home.daemon_key_path).public_key())
    assert store.load().active_actions(bob, 2**50) == set()  # far future: the 30d grants expired anyway
    text_listing = covenant("grants")
    assert text_listing.returncode == 0
    assert "bob@lap" in text_listing.stdout and "memory.read" not in text_listing.stdout


def test_grant_to_own_identity_by_display_name(daemon_home: Home) -> None:
    assert covenant("identity", "init", "--display", "ana@box").returncode == 0
    result = covenant("grant", "ana@box", "tool.x")
    assert result.returncode == 0, result.stderr
    pub = json.loads(covenant("identity", "show", "--json").stdout)["pubkey"]
    assert json.loads(covenant("grants", "--json").stdout)["grants"][0]["issuer"] == pub


def test_grant_refuses_unknown_issuer_and_bad_action(daemon_home: Home) -> None:
    unknown = covenant("grant", "carol", "tool.x")
    assert unknown.returncode == 2 and "covenant identity add carol" in unknown.stderr
    pub = public_key_hex(Ed25519PrivateKey.generate())
    bad = covenant("grant", pub, "foo.bar")
    assert bad.returncode == 2 and "reserved namespaces" in bad.stderr
    bad_duration = covenant("grant", pub, "tool.x", "--expires", "soon")
    assert bad_duration.returncode == 2 and "90m" in bad_duration.stderr
    assert not daemon_home.grants_path.exists()


def test_grants_reports_hand_edits_and_exits_1(daemon_home: Home) -> None:
    pub = public_key_hex(Ed25519PrivateKey.generate())
    assert covenant("grant", pub, "tool.x").returncode == 0
    path: Path = daemon_home.grants_path
    path.write_text(path.read_text().replace('"tool.x"', '"tool.y"'))
    result = covenant("grants")
    assert result.returncode == 1
    assert f"{path}:" in result.stderr and "does not verify" in result.stderr and "tool.y" in result.stderr
    as_json = covenant("grants", "--json")
    assert as_json.returncode == 1
    data = json.loads(as_json.stdout)
    assert data["grants"] == [] and data["problems"][0]["line"] is not None


def test_grant_without_daemon_key_says_so(home: Home) -> None:
    result = covenant("grant", "ab" * 32, "tool.x")
    assert result.returncode == 2 and "daemon.key" in result.stderr
