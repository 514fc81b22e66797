"""Build and sign intents (DESIGN.md §7b). Light: ``covenant dispatch`` imports it.

The signature is Ed25519 over the canonical JSON of the intent object exactly
as sent: sorted keys, no spaces, UTF-8 with non-ASCII kept. There is no
domain-separation prefix: the wire format fixes the signed bytes, and the
daemon key (which signs grants and audit checkpoints, both tagged) is never
a user key, so an intent signature cannot be mistaken for either.

Only the stdlib, :mod:`covenant.canonical`, :mod:`covenant.keys` and
cryptography are imported here (no pydantic, trio, psutil or yaml).
"""

from __future__ import annotations

import os
import time

from covenant.canonical import canonical_bytes
from covenant.keys import public_key_from_hex, verify_signature
from covenant.policy.errors import BadIntent
from covenant.priorities import PRIORITIES

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    from typing import Any

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "random_uuid4",
    "INTENT_FIELDS",
    "MAX_ID_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_DISPLAY_CHARS",
    "MAX_AGENT_CHARS",
    "ID_PATTERN",
    "PUBKEY_PATTERN",
    "SIGNATURE_PATTERN",
    "display_problem",
    "is_signature_hex",
    "new_intent",
    "intent_signing_bytes",
    "sign_intent",
    "verify_intent_signature",
    "signature_matches",
]

INTENT_FIELDS: tuple[str, ...] = ("id", "text", "agent", "issuer", "issued_at", "priority", "parent")

MAX_ID_CHARS = 128
MAX_TEXT_CHARS = 256 * 1024
MAX_DISPLAY_CHARS = 256
MAX_AGENT_CHARS = 256

# Intent ids key dispatch records, URLs (/v1/dispatches/{id}) and log lines, so
# they are restricted to a path- and shell-safe alphabet; uuid4 strings fit.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
PUBKEY_PATTERN = r"^[0-9a-f]{64}$"
SIGNATURE_PATTERN = r"^[0-9a-f]{128}$"

# Character sets rather than the patterns above compiled: `covenant dispatch` imports no `re` (with the
# `enum` it brings, ≈ 21 million instructions; issue 38).
_CONTROL = frozenset(map(chr, (*range(0x20), *range(0x7F, 0xA0))))
_LOWER_HEX = frozenset("0123456789abcdef")


def is_signature_hex(value: object) -> bool:
    """True for a string of exactly 128 lowercase hex digits (:data:`SIGNATURE_PATTERN`, no trailing newline)."""
    return isinstance(value, str) and len(value) == 128 and _LOWER_HEX.issuperset(value)


def display_problem(display: object) -> str | None:
    """Why ``display`` is not a usable display name (``user@host``), or None."""
    if not isinstance(display, str):
        return f"a display name must be a string, got {type(display).__name__}"
    if not display.strip():
        return "a display name must not be empty"
    if len(display) > MAX_DISPLAY_CHARS:
        return f"a display name is at most {MAX_DISPLAY_CHARS} characters"
    if not _CONTROL.isdisjoint(display):
        return "a display name must not contain control characters"
    try:
        display.encode("utf-8")
    except UnicodeEncodeError:
        return "a display name must be valid Unicode (no lone surrogates)"
    return None


def random_uuid4() -> str:
    """A random (version 4) UUID string, as ``str(uuid.uuid4())`` makes.

    Written out because importing :mod:`uuid` also imports :mod:`platform`
    (~4 ms of every ``covenant dispatch``); the format is RFC 4122's: 122 random
    bits, version nibble 4, variant bits 10.
    """
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_intent(
    text: str,
    *,
    issuer_display: str,
    issuer_pubkey: str,
    agent: str | None = None,
    priority: str = "normal",
    parent: str | None = None,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """A fresh, unsigned intent: uuid4 ``id`` and ``issued_at`` in ms since the epoch.

    Example: ``sign_intent(key, new_intent("summarise x", issuer_display="ana@box", issuer_pubkey=pub))``.
    """
    if priority not in PRIORITIES:
        raise BadIntent(f"priority {priority!r} is not one of {', '.join(PRIORITIES)}", field="priority")
    return {
        "id": random_uuid4(),
        "text": text,
        "agent": agent,
        "issuer": {"display": issuer_display, "pubkey": issuer_pubkey},
        "issued_at": time.time_ns() // 1_000_000 if now_ms is None else now_ms,
        "priority": priority,
        "parent": parent,
    }


def intent_signing_bytes(intent: dict[str, Any]) -> bytes:
    """The exact bytes an intent signature covers: its canonical JSON."""
    try:
        return canonical_bytes(intent)
    except (UnicodeEncodeError, ValueError, TypeError) as exc:
        raise BadIntent(f"intent cannot be encoded as canonical JSON: {exc}") from None


def sign_intent(key: Ed25519PrivateKey, intent: dict[str, Any]) -> str:
    """Hex Ed25519 signature of ``intent_signing_bytes(intent)``."""
    return key.sign(intent_signing_bytes(intent)).hex()


def verify_intent_signature(intent: dict[str, Any], signature: str, *, signer: str | None = None) -> bool:
    """True when ``signature`` (hex) is the issuer's signature over ``intent``.

    The key is ``intent["issuer"]["pubkey"]``; the display name plays no part.
    ``signer`` (hex public key) replaces it for an intent the daemon signed on
    its issuer's behalf (a schedule or webhook firing, covenant.triggers).
    False for any malformed input (never raises on attacker-controlled data
    except BadIntent for an intent that cannot be canonically encoded).
    """
    issuer = intent.get("issuer")
    pubkey = signer if signer is not None else (issuer.get("pubkey") if isinstance(issuer, dict) else None)
    return signature_matches(intent_signing_bytes(intent), signature, pubkey)


def signature_matches(message: bytes, signature: Any, pubkey: Any) -> bool:
    """True when ``signature`` (hex) is ``pubkey``'s (hex) Ed25519 signature over ``message``.

    False for a malformed signature or key; never raises.
    """
    if not is_signature_hex(signature) or not isinstance(pubkey, str):
        return False
    try:
        public_key = public_key_from_hex(pubkey)
    except ValueError:
        return False
    return verify_signature(public_key, bytes.fromhex(signature), message)
