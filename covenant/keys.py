"""Ed25519 key files: create, load (with permission checks), encode public keys.

Key files are PEM PKCS#8 so ``openssl pkey`` can read them. Public keys travel
as the 32 raw bytes in lowercase hex. This module avoids heavy imports: the
``covenant dispatch`` path uses it.

Loading a PEM key: ``cryptography.hazmat.primitives.serialization`` is the
public home of ``load_pem_private_key``, but importing that package also
imports its SSH key support (ciphers, RSA, DSA, EC): 10-30 ms of the
dispatch process's start-up on the reference box. Its
``load_pem_private_key`` *is* the Rust binding's function (the package only
re-exports it), so we take that same function from the binding and fall back
to the package should a cryptography release move it. A test checks that the
two are the same object.

The same goes for the key classes: ``cryptography.hazmat.primitives.asymmetric.ed25519``
and ``cryptography.exceptions`` import :mod:`typing` (≈ 10 million instructions, a third of
``python -c pass``; issue 38), so what ``covenant dispatch`` runs (load the key, its public
key, sign) uses the binding's ``Ed25519PrivateKey``, the class the public one registers as
its implementation, and everything else imports the public module when called. A test
checks that the binding's classes are the public ones' implementations.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from covenant.errors import KeyFileError

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    from pathlib import Path

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "create_key_file",
    "load_private_key",
    "public_key_hex",
    "public_key_from_hex",
    "verify_signature",
    "ensure_private_dir",
]


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) with mode 0700 for the leaf."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def create_key_file(path: Path) -> Ed25519PrivateKey:
    """Create a new key at ``path`` (0600). Never overwrites an existing file."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    ensure_private_dir(path.parent)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # O_EXCL: two concurrent `covenant init` runs must not clobber each other's key.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    return key


def _pem_private_key_loader() -> Callable[..., object]:
    """``serialization.load_pem_private_key``, without importing the serialization package."""
    try:
        from cryptography.hazmat.bindings._rust import openssl as rust_openssl

        return rust_openssl.keys.load_pem_private_key  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        from cryptography.hazmat.primitives import serialization

        return serialization.load_pem_private_key


def private_key_class() -> type:
    """The class of an Ed25519 private key as loaded: the binding's, else the public ABC (which
    ``isinstance`` accepts the binding's objects for too), without importing the public module."""
    try:
        from cryptography.hazmat.bindings._rust import openssl as rust_openssl

        return rust_openssl.ed25519.Ed25519PrivateKey  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return Ed25519PrivateKey


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Load an Ed25519 private key, refusing symlinks and files others can read.

    Raises KeyFileError naming the file and the fix.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: key file not found (run `covenant init`)", path=str(path)) from None
    except OSError as exc:
        if os.path.islink(path):
            raise KeyFileError(f"{path}: key file is a symlink; refusing to follow it (put the key file itself there)", path=str(path)) from None
        raise KeyFileError(f"{path}: cannot open key file: {exc.strerror} (run as its owner, or as root)", path=str(path)) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{path}: key file is not a regular file (put the PEM key file itself there)", path=str(path))
        if st.st_mode & 0o077:
            raise KeyFileError(
                f"{path}: key file mode is {stat.S_IMODE(st.st_mode):04o}; it must not be readable by "
                f"group or others (fix: chmod 600 {path})",
                path=str(path),
            )
        data = f.read()
    try:
        key = _pem_private_key_loader()(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not a PEM PKCS#8 private key ({exc}); restore it from a backup (`openssl pkey -in FILE` reads a good one)", path=str(path)) from None
    if not isinstance(key, private_key_class()):
        raise KeyFileError(f"{path}: key is not Ed25519; covenant signs with Ed25519 keys only (`openssl genpkey -algorithm ed25519`)", path=str(path))
    return key  # type: ignore[return-value]


def public_key_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The 32 raw public-key bytes as lowercase hex."""
    pub = key.public_key() if isinstance(key, private_key_class()) else key
    return pub.public_bytes_raw().hex()


def public_key_from_hex(text: str) -> Ed25519PublicKey:
    """Parse a public key given as 64 lowercase hex characters. Raises ValueError."""
    if len(text) != 64 or text != text.lower():
        raise ValueError("a public key is 64 lowercase hex characters")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))


def verify_signature(public_key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    """True when ``signature`` is a valid Ed25519 signature of ``message``."""
    from cryptography.exceptions import InvalidSignature

    try:
        public_key.verify(signature, message)
    except InvalidSignature:
        return False
    return True
