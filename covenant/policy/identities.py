"""Who signs intents: the user's own key, and other issuers a home knows by name.

The user's identity is ``$XDG_CONFIG_HOME/covenant/identity.key`` (PEM PKCS#8,
0600) with its display name in ``identity.toml`` beside it. A home keeps the
public keys of issuers it can grant to by name in ``identities.toml``.
Names are labels for operators; every decision binds to the public key.

Light: ``covenant dispatch`` loads the user's identity through this module, so
only the stdlib, :mod:`covenant.keys` and cryptography are imported at module
level (tomlkit only when a file is written).
"""

from __future__ import annotations

import os
from collections import namedtuple

from covenant.home_paths import user_identity_file
from covenant.json_fast import dumps
from covenant.keys import create_key_file, load_private_key, public_key_from_hex, public_key_hex
from covenant.policy.errors import IdentityError, UnknownIdentity
from covenant.policy.signing import display_problem

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import NamedTuple

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from covenant.home import Home

__all__ = [
    "UserIdentity",
    "KnownIdentities",
    "default_display",
    "user_display_path",
    "ensure_user_identity",
    "init_user_identity",
    "load_user_identity",
    "normalize_pubkey",
]

# Character sets, not regular expressions: `covenant dispatch` reads the identity on every run and imports
# no `re` (with its `enum`, ≈ 21 million instructions; issue 38).
_HEX = frozenset("0123456789abcdefABCDEF")
_NOT_IN_COMMENT = frozenset(map(chr, (*range(0x09), *range(0x0A, 0x20), 0x7F)))
_NOT_IN_NAME = frozenset(map(chr, (*range(0x20), 0x7F))) | {'"', "\\"}
_DISPLAY_LINE = 'display = "'


def _is_hex64(text: str) -> bool:
    return len(text) == 64 and _HEX.issuperset(text)


def _as_written(text: str) -> str | None:
    """The display name of identity.toml exactly as :func:`_write_display` writes it for a name without
    escapes (comment lines, then ``display = "NAME"`` and a newline), or None: read without tomllib."""
    if not text.endswith("\n"):
        return None
    *comments, last, _ = text.split("\n")
    if not (last.startswith(_DISPLAY_LINE) and last.endswith('"') and len(last) > len(_DISPLAY_LINE)):
        return None
    if any(not line.startswith("#") or not _NOT_IN_COMMENT.isdisjoint(line) for line in comments):
        return None
    name = last[len(_DISPLAY_LINE):-1]
    return name if _NOT_IN_NAME.isdisjoint(name) else None


# collections.namedtuple at run time, typing.NamedTuple for type checkers: ``covenant dispatch`` imports
# no typing (≈ 10 million instructions), and a class-syntax NamedTuple here (this module's annotations
# are strings) would call the builtin ``compile``, whose first call costs ≈ 7.6 million more
# (covenant.home_paths says more; docs/performance.md, issue 38).
if TYPE_CHECKING:
    class _UserIdentityFields(NamedTuple):
        key: Ed25519PrivateKey
        display: str
        path: str
else:
    _UserIdentityFields = namedtuple("_UserIdentityFields", ["key", "display", "path"])


class UserIdentity(_UserIdentityFields):
    """The user's signing key (``key``), the display name sent with each intent (``display``) and the
    key file (``path``, a str: ``covenant dispatch`` does not import pathlib). A NamedTuple: see Home."""

    __slots__ = ()

    @property
    def pubkey(self) -> str:
        """Lowercase hex of the 32 raw public-key bytes."""
        return public_key_hex(self.key)


def default_display() -> str:
    """``$USER@<hostname>`` (getpass falls back to the password database)."""
    try:
        import getpass  # only when creating an identity: keeps `covenant dispatch` fast

        user = getpass.getuser()
    except (OSError, KeyError):
        user = str(os.getuid())
    return f"{user}@{os.uname().nodename}"


def user_display_file() -> str:
    """``identity.toml`` beside the user's key: holds its display name."""
    return os.path.join(os.path.dirname(user_identity_file()), "identity.toml")


def user_display_path() -> Path:
    """:func:`user_display_file` as a Path."""
    from pathlib import Path

    return Path(user_display_file())


def _check_display(display: str) -> str:
    problem = display_problem(display)
    if problem:
        raise IdentityError(f"display name {display!r}: {problem}", field="display")
    return display


def _read_display(path: str) -> str | None:
    """The display name in identity.toml; None when there is no such file.

    ``covenant dispatch`` reads it on every run: a file as covenant wrote it is
    matched whole by one pattern (importing tomllib costs ~3 ms of the CLI's
    ~50); anything else -- edited by hand, escapes -- is parsed as TOML.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IdentityError(f"{path}: not UTF-8 text ({exc.reason}) (fix or delete the file)", path=str(path)) from None
    display: object = _as_written(text)
    if display is None:
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise IdentityError(f"{path}: {exc} (fix or delete the file)", path=str(path)) from None
        display = data.get("display")
    problem = display_problem(display)
    if problem:
        raise IdentityError(f"{path}: `display`: {problem}", path=str(path), field="display")
    return display


def _write_display(path: Path, display: str) -> None:
    # A JSON string without control characters (display_problem forbids them)
    # is a valid TOML basic string: only '"' and '\\' get escaped.
    text = (
        "# The display name sent with your signed intents (a label; your public key is the identity).\n"
        f"display = {dumps(display, ensure_ascii=False)}\n"
    )
    from covenant.policy._files import atomic_write_text  # writers only (tempfile is slow to import)

    atomic_write_text(path, text, mode=0o600)


def _create(display: str) -> UserIdentity:
    from covenant.home import user_identity_path  # pathlib: only when the identity is first made

    key = create_key_file(user_identity_path())
    _write_display(user_display_path(), display)
    return UserIdentity(key=key, display=display, path=user_identity_file())


def init_user_identity(display: str | None = None) -> UserIdentity:
    """Create the user's identity; refuse when a key already exists (never overwrite one)."""
    path = user_identity_file()
    chosen = _check_display(display or default_display())
    if os.path.lexists(path):
        raise IdentityError(
            f"{path}: an identity key already exists; refusing to overwrite it "
            f"(`covenant identity show` prints it; move the file aside to make a new one)",
            path=str(path),
        )
    try:
        return _create(chosen)
    except FileExistsError:
        raise IdentityError(f"{path}: an identity key was created concurrently; refusing to overwrite it",
                            path=str(path)) from None


def load_user_identity() -> UserIdentity:
    """Load the user's key (refusing symlinks and keys readable by others) and its display name."""
    path = user_identity_file()
    if not os.path.lexists(path):
        raise IdentityError(
            f"{path}: no identity key (create one with `covenant identity init` or `covenant init`)",
            path=str(path),
        )
    key = load_private_key(path)
    display = _read_display(user_display_file()) or default_display()
    return UserIdentity(key=key, display=display, path=path)


def ensure_user_identity(display: str | None = None) -> tuple[UserIdentity, bool]:
    """Load the user's identity, creating it when missing; the bool says it was created.

    An existing identity keeps its stored display name (``display`` applies only
    to a new one); a missing ``identity.toml`` is written with the default name.
    """
    path = user_identity_file()
    if not os.path.lexists(path):
        try:
            return _create(_check_display(display or default_display())), True
        except FileExistsError:
            pass  # another process created it between our check and O_EXCL: use theirs
    key = load_private_key(path)
    stored = _read_display(user_display_file())
    if stored is None:
        stored = _check_display(display or default_display())
        _write_display(user_display_path(), stored)
    return UserIdentity(key=key, display=stored, path=path), False


def normalize_pubkey(text: str) -> str:
    """A public key as 64 lowercase hex; raises IdentityError when it is not a valid Ed25519 key."""
    candidate = text.strip().lower()
    try:
        public_key_from_hex(candidate)
    except ValueError:
        raise IdentityError(
            f"{text!r} is not a public key (64 hex characters, as `covenant identity show` prints)",
            field="pubkey",
        ) from None
    return candidate


class KnownIdentities:
    """``<home>/identities.toml``: display name -> public key, so operators can grant by name.

    File format::

        [identities]
        "alice@laptop" = "3f1c…(64 hex)"
    """

    HEADER = (
        "Issuers this covenant home knows by name (`covenant identity add NAME PUBKEY`).\n"
        "Grants bind to the public key; the name is only how operators refer to it."
    )

    def __init__(self, home: Home) -> None:
        self.home = home
        self.path = home.known_identities_path

    def all(self) -> dict[str, str]:
        """Every known ``display -> pubkey``, in file order; raises IdentityError for a bad file."""
        import tomllib  # not on `covenant dispatch`'s path

        try:
            with open(self.path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            return {}
        except tomllib.TOMLDecodeError as exc:
            raise IdentityError(f"{self.path}: not valid TOML: {exc}; fix the syntax (or re-add names with "
                                "`covenant identity add`)", path=str(self.path)) from None
        table = data.get("identities", {})
        if not isinstance(table, dict):
            raise IdentityError(f"{self.path}: `identities` must be a table of name = \"pubkey\"",
                                path=str(self.path))
        known: dict[str, str] = {}
        for display, pubkey in table.items():
            if not isinstance(pubkey, str) or not _is_hex64(pubkey):
                raise IdentityError(
                    f"{self.path}: identities.{dumps(display, ensure_ascii=False)}: value must be a "
                    f"64-hex public key",
                    path=str(self.path),
                    field=display,
                )
            known[display] = pubkey.lower()
        return known

    def resolve(self, name_or_pubkey: str) -> str:
        """The public key for a 64-hex key (returned normalized) or a known display name."""
        text = name_or_pubkey.strip()
        if _is_hex64(text):
            return normalize_pubkey(text)
        pubkey = self.all().get(text)
        if pubkey is None:
            raise UnknownIdentity(
                f"unknown issuer {name_or_pubkey!r}: not a 64-hex public key and not a name in {self.path} "
                f"(record it with `covenant identity add {name_or_pubkey} PUBKEY`, or pass the public key)",
                issuer=name_or_pubkey,
            )
        return pubkey

    def display_for(self, pubkey: str) -> str | None:
        """The first name recorded for ``pubkey``, or None."""
        wanted = pubkey.lower()
        for display, known in self.all().items():
            if known == wanted:
                return display
        return None

    def add(self, display: str, pubkey: str) -> bool:
        """Record ``display -> pubkey``; False when already recorded exactly so.

        A name already bound to a different key is refused: silently re-pointing
        a name would re-target every later `covenant grant NAME …`.
        """
        import tomlkit  # only writers pay for tomlkit

        from covenant.policy._files import atomic_write_text, locked

        _check_display(display)
        pubkey = normalize_pubkey(pubkey)
        if not self.path.parent.is_dir():
            raise IdentityError(f"no covenant home at {self.path.parent} (run `covenant init`)",
                                path=str(self.path.parent))
        with locked(self.path):
            current = self.all().get(display)
            if current == pubkey:
                return False
            if current is not None:
                raise IdentityError(
                    f"{self.path}: {display!r} already names public key {current}; remove that line first "
                    f"if the issuer really changed keys (grants to the old key stay bound to it)",
                    path=str(self.path),
                    field=display,
                )
            try:
                doc = tomlkit.parse(self.path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                doc = tomlkit.document()
                for line in self.HEADER.splitlines():
                    doc.add(tomlkit.comment(line))
                doc.add(tomlkit.nl())
            if "identities" not in doc:
                doc.add("identities", tomlkit.table())
            doc["identities"][display] = pubkey  # type: ignore[index]
            atomic_write_text(self.path, tomlkit.dumps(doc), mode=0o600)
        return True
