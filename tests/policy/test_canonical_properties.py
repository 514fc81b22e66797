"""Property tests: every well-formed intent round-trips through canonical JSON and verifies;
any single change to any field breaks the signature."""

from __future__ import annotations

import copy
import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from covenant.canonical import canonical_bytes, is_canonical_line, parse_strict
from covenant.keys import public_key_hex
from covenant.policy.intents import IntentVerifier
from covenant.policy.signing import MAX_DISPLAY_CHARS, sign_intent, verify_intent_signature

KEY = Ed25519PrivateKey.generate()
PUB = public_key_hex(KEY)
NOW = 1_760_000_000_000

# Text: any Unicode scalar values (no lone surrogates: they are not UTF-8), controls and NUL included.
texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=200)
ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:-]{0,40}\Z")
displays = st.text(
    alphabet=st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=40
).filter(lambda s: s.strip() and len(s) <= MAX_DISPLAY_CHARS)

intents = st.fixed_dictionaries(
    {
        "id": ids,
        "text": texts,
        "agent": st.none() | st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30),
        "issuer": st.fixed_dictionaries({"display": displays, "pubkey": st.just(PUB)}),
        "issued_at": st.integers(min_value=NOW - 300_000, max_value=NOW + 300_000),
        "priority": st.sampled_from(["low", "normal", "high"]),
        "parent": st.none() | ids,
    }
)


def _wire(intent: dict[str, Any]) -> dict[str, Any]:
    """What the daemon sees: the body serialized by a client, parsed strictly."""
    body = {"intent": intent, "signature": sign_intent(KEY, intent)}
    return parse_strict(json.dumps(body).encode())  # ASCII-escaped on the wire: still the same intent


@settings(max_examples=300, deadline=None)
@given(intents)
def test_any_intent_round_trips_and_verifies(intent: dict[str, Any]) -> None:
    encoded = canonical_bytes(intent)
    assert is_canonical_line(encoded)
    assert parse_strict(encoded) == intent
    received = _wire(intent)
    assert received["intent"] == intent
    verified = IntentVerifier(skew_s=300, replay_cache_size=10).verify(received, NOW)
    assert verified.model_dump() == intent


def _mutations(intent: dict[str, Any], draw: Any) -> dict[str, Any]:
    changed = copy.deepcopy(intent)
    field = draw(st.sampled_from(["id", "text", "agent", "display", "pubkey", "issued_at", "priority", "parent"]))
    if field == "display":
        target, key = changed["issuer"], "display"
    elif field == "pubkey":
        target, key = changed["issuer"], "pubkey"
    else:
        target, key = changed, field
    old = target[key]
    if field == "pubkey":
        new: Any = public_key_hex(Ed25519PrivateKey.generate())
    elif field == "issued_at":
        new = old + draw(st.sampled_from([-1, 1, 1000]))
    elif field == "priority":
        new = draw(st.sampled_from([p for p in ("low", "normal", "high") if p != old]))
    elif field in ("agent", "parent") and old is not None:
        new = draw(st.sampled_from([None, old + "x"]))
    elif field in ("agent", "parent"):
        new = "x"
    else:
        new = draw(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=50).filter(lambda s: s != old))
    target[key] = new
    return changed


@settings(max_examples=300, deadline=None)
@given(intents, st.data())
def test_any_single_change_breaks_the_signature(intent: dict[str, Any], data: st.DataObject) -> None:
    signature = sign_intent(KEY, intent)
    changed = _mutations(intent, data.draw)
    assert changed != intent
    assert not verify_intent_signature(changed, signature)


@settings(max_examples=100, deadline=None)
@given(intents, st.integers(min_value=0, max_value=511))
def test_any_flipped_signature_bit_fails(intent: dict[str, Any], bit: int) -> None:
    signature = bytearray(bytes.fromhex(sign_intent(KEY, intent)))
    signature[bit // 8] ^= 1 << (bit % 8)
    assert not verify_intent_signature(intent, signature.hex())
