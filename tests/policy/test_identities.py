"""The user's identity files and the home's known issuers."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.errors import KeyFileError
from covenant.home import Home, user_identity_path
from covenant.keys import public_key_hex
from covenant.policy.errors import IdentityError, UnknownIdentity
from covenant.policy.identities import (
    KnownIdentities,
    default_display,
    ensure_user_identity,
    init_user_identity,
    load_user_identity,
    user_display_path,
)


def test_ensure_creates_once_with_mode_0600(home: Home) -> None:
    me, created = ensure_user_identity("ana@box")
    assert created and me.display == "ana@box" and len(me.pubkey) == 64
    path = user_identity_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    again, created_again = ensure_user_identity("other@box")
    assert not created_again and again.pubkey == me.pubkey and again.display == "ana@box"
    loaded = load_user_identity()
    assert loaded.pubkey == me.pubkey and loaded.display == "ana@box"


def test_default_display_is_user_at_host(home: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "kim")
    monkeypatch.delenv("LOGNAME", raising=False)
    assert default_display() == f"kim@{os.uname().nodename}"
    me, _ = ensure_user_identity()
    assert me.display == f"kim@{os.uname().nodename}"


def test_display_with_quotes_and_unicode_round_trips(home: Home) -> None:
    ensure_user_identity('Zoë "z" \\ ops@host')
    assert load_user_identity().display == 'Zoë "z" \\ ops@host'


@pytest.mark.parametrize("text, display", [
    ('# mine\ndisplay = "ana@box"\n', "ana@box"),  # as covenant writes it: read without tomllib
    ('display = "Zo\u00eb \\"z\\" ops"\n', 'Zoë "z" ops'),  # escapes: parsed as TOML
    ("display = 'ana@box' # edited by hand\ncolour = 'blue'\n", "ana@box"),
    ('display = "ana@box"\r\n', "ana@box"),
])
def test_a_display_file_reads_the_same_written_or_edited(home: Home, text: str, display: str) -> None:
    ensure_user_identity("first@box")
    user_display_path().write_text(text, newline="")
    assert load_user_identity().display == display


@pytest.mark.parametrize("raw", [b'# \x01 control\ndisplay = "ana@box"\n', b'display = "\xffana"\n', b'display = "a\tb"\n'])
def test_a_display_file_toml_refuses_is_refused(home: Home, raw: bytes) -> None:
    ensure_user_identity("first@box")
    user_display_path().write_bytes(raw)
    with pytest.raises(IdentityError):
        load_user_identity()


def test_bad_display_is_refused(home: Home) -> None:
    with pytest.raises(IdentityError):
        init_user_identity("two\nlines")
    assert not user_identity_path().exists()


def test_init_refuses_to_overwrite(home: Home) -> None:
    me = init_user_identity("ana@box")
    before = user_identity_path().read_bytes()
    with pytest.raises(IdentityError, match="refusing to overwrite"):
        init_user_identity("ana@box")
    assert user_identity_path().read_bytes() == before and load_user_identity().pubkey == me.pubkey


def test_key_readable_by_others_is_refused(home: Home) -> None:
    ensure_user_identity("ana@box")
    os.chmod(user_identity_path(), 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_user_identity()
    with pytest.raises(KeyFileError):
        ensure_user_identity()


def test_symlinked_key_is_refused(home: Home, tmp_path: Path) -> None:
    me, _ = ensure_user_identity("ana@box")
    real = tmp_path / "real.key"
    os.rename(user_identity_path(), real)
    os.symlink(real, user_identity_path())
    with pytest.raises(KeyFileError, match="symlink"):
        load_user_identity()


def test_missing_key_says_how_to_create_one(home: Home) -> None:
    with pytest.raises(IdentityError, match="covenant identity init"):
        load_user_identity()


def test_missing_display_file_falls_back_to_default(home: Home) -> None:
    ensure_user_identity("ana@box")
    user_display_path().unlink()
    assert load_user_identity().display == default_display()


def test_other_uid_cannot_read_the_key(home: Home) -> None:
    me, _ = ensure_user_identity("ana@box")
    path = user_identity_path()
    os.chmod(path.parent.parent, 0o755)  # let the other uid reach the file: only its mode protects it
    os.chmod(path.parent, 0o755)
    child = (
        "import os, sys, pathlib\n"
        "from covenant.keys import load_private_key\n"  # import first: the interpreter may live under /root
        "from covenant.errors import KeyFileError\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        "    load_private_key(pathlib.Path(sys.argv[1]))\n"
        "except KeyFileError as exc:\n"
        "    print('refused:', exc.message); sys.exit(0)\n"
        "print('READ THE KEY'); sys.exit(1)\n"
    )
    result = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "refused:" in result.stdout and "Permission denied" in result.stdout


def test_known_identities_add_resolve_display(home: Home) -> None:
    known = KnownIdentities(home)
    bob = public_key_hex(Ed25519PrivateKey.generate())
    assert known.add("bob@lap", bob.upper())
    assert not known.add("bob@lap", bob)  # same binding again: no change
    assert known.resolve("bob@lap") == bob
    assert known.resolve(bob.upper()) == bob
    assert known.display_for(bob) == "bob@lap"
    assert known.display_for("00" * 32) is None
    with pytest.raises(UnknownIdentity, match="covenant identity add carol"):
        known.resolve("carol")
    with pytest.raises(IdentityError, match="already names"):
        known.add("bob@lap", public_key_hex(Ed25519PrivateKey.generate()))
    with pytest.raises(IdentityError, match="not a public key"):
        known.add("eve", "12" * 31)


def test_known_identities_keep_operator_comments(home: Home) -> None:
    home.known_identities_path.write_text(
        '# team keys, see wiki\n[identities]\n# ops lead\n"kim@ops" = "' + "ab" * 32 + '"\n'
    )
    known = KnownIdentities(home)
    known.add("bob@lap", public_key_hex(Ed25519PrivateKey.generate()))
    text = home.known_identities_path.read_text()
    assert "# team keys, see wiki" in text and "# ops lead" in text
    assert list(known.all()) == ["kim@ops", "bob@lap"]


def test_known_identities_bad_value_is_reported(home: Home) -> None:
    home.known_identities_path.write_text('[identities]\n"kim@ops" = "short"\n')
    with pytest.raises(IdentityError, match="kim@ops"):
        KnownIdentities(home).all()


def test_add_without_a_home_says_run_init(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="covenant init"):
        KnownIdentities(Home(tmp_path / "missing")).add("bob@lap", "ab" * 32)


def test_light_modules_do_not_import_heavy_dependencies() -> None:
    code = (
        "import sys\n"
        "import covenant.policy.signing, covenant.policy.identities, covenant.policy.errors\n"
        "heavy = [m for m in ('pydantic', 'trio', 'psutil', 'yaml', 'tomlkit', 'tomllib') if m in sys.modules]\n"
        "print(heavy); sys.exit(1 if heavy else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pem_loader_is_the_public_serialization_function() -> None:
    """covenant.keys takes load_pem_private_key from the Rust binding to skip importing the
    serialization package; it must be the very function that package exports."""
    from cryptography.hazmat.primitives import serialization

    from covenant.keys import _pem_private_key_loader

    assert _pem_private_key_loader() is serialization.load_pem_private_key


def test_the_key_class_the_dispatch_path_checks_is_the_public_ones_implementation(tmp_path: Path) -> None:
    """covenant.keys checks a loaded key against the binding's class so that `covenant dispatch` does not import
    cryptography's public Ed25519 module (and typing with it); it must be what the public class stands for: a
    generated key and a loaded one are instances of both, a public key and an Ed448 key of neither."""
    from cryptography.hazmat.primitives.asymmetric.ed448 import Ed448PrivateKey
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from covenant.keys import create_key_file, load_private_key, private_key_class, public_key_hex

    binding_class = private_key_class()
    assert binding_class is not Ed25519PrivateKey  # the binding's own class, not the fallback
    assert issubclass(binding_class, Ed25519PrivateKey)
    created = create_key_file(tmp_path / "k.pem")
    loaded = load_private_key(tmp_path / "k.pem")
    for key in (created, loaded, Ed25519PrivateKey.generate()):
        assert isinstance(key, binding_class) and isinstance(key, Ed25519PrivateKey)
    assert not isinstance(loaded.public_key(), binding_class)
    assert not isinstance(Ed448PrivateKey.generate(), binding_class)
    assert public_key_hex(loaded) == public_key_hex(loaded.public_key()) == public_key_hex(created)
