"""The intent verifier: shape, signature, skew, replay — each refusal with its code."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.keys import public_key_hex
from covenant.policy.errors import BadIntent, BadSignature, PolicyDenied, ReplayedIntent, StaleIntent
from covenant.policy.intents import IntentVerifier
from covenant.policy.signing import new_intent, sign_intent

from .conftest import NOW

SKEW_S = 300


def body_for(key: Ed25519PrivateKey, text: str = "summarise the report", **kw: Any) -> dict[str, Any]:
    intent = new_intent(text, issuer_display="ana@box", issuer_pubkey=public_key_hex(key), now_ms=NOW, **kw)
    return {"intent": intent, "signature": sign_intent(key, intent), "dry_run": False}


def verifier(size: int = 1000) -> IntentVerifier:
    return IntentVerifier(skew_s=SKEW_S, replay_cache_size=size)


def test_valid_signature_is_accepted(alice: Ed25519PrivateKey) -> None:
    body = body_for(alice, agent="research@local", priority="high")
    intent = verifier().verify(body, NOW)
    assert intent.id == body["intent"]["id"]
    assert intent.issuer.pubkey == public_key_hex(alice)
    assert intent.agent == "research@local" and intent.priority == "high"


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda i: i.__setitem__("text", i["text"] + "!"), id="text"),
        pytest.param(lambda i: i["issuer"].__setitem__("display", "root@box"), id="issuer-display"),
        pytest.param(lambda i: i.__setitem__("agent", "other@local"), id="agent"),
        pytest.param(lambda i: i.__setitem__("priority", "high"), id="priority"),
        pytest.param(lambda i: i.__setitem__("issued_at", i["issued_at"] + 1), id="issued_at"),
        pytest.param(lambda i: i.__setitem__("parent", "abc"), id="parent"),
    ],
)
def test_tampered_intent_is_bad_signature(alice: Ed25519PrivateKey, tamper: Any) -> None:
    body = body_for(alice)
    tamper(body["intent"])
    with pytest.raises(BadSignature) as err:
        verifier().verify(body, NOW)
    assert err.value.code == "bad_signature" and err.value.http_status == 401 and err.value.exit_code == 3


def test_tampered_issuer_pubkey_is_bad_signature(alice: Ed25519PrivateKey) -> None:
    mallory = Ed25519PrivateKey.generate()
    body = body_for(alice)
    body["intent"]["issuer"]["pubkey"] = public_key_hex(mallory)  # claim to be someone else
    with pytest.raises(BadSignature):
        verifier().verify(body, NOW)


def test_signed_by_wrong_key_is_bad_signature(alice: Ed25519PrivateKey) -> None:
    mallory = Ed25519PrivateKey.generate()
    body = body_for(alice)
    body["signature"] = sign_intent(mallory, body["intent"])
    with pytest.raises(BadSignature):
        verifier().verify(body, NOW)


@pytest.mark.parametrize("signature", ["", "zz" * 64, "ab" * 63, "AB" * 64, "00" * 64])
def test_malformed_signature_is_bad_signature(alice: Ed25519PrivateKey, signature: str) -> None:
    body = body_for(alice)
    body["signature"] = signature
    with pytest.raises(BadSignature):
        verifier().verify(body, NOW)


@pytest.mark.parametrize("offset_ms", [-(SKEW_S * 1000 + 1), SKEW_S * 1000 + 1, -86_400_000, 86_400_000])
def test_stale_issued_at_is_refused_past_and_future(alice: Ed25519PrivateKey, offset_ms: int) -> None:
    body = body_for(alice)
    with pytest.raises(StaleIntent) as err:
        verifier().verify(body, NOW - offset_ms)  # the daemon's clock is off by offset
    assert err.value.code == "stale_intent" and err.value.http_status == 401
    assert err.value.details["skew_s"] == SKEW_S


@pytest.mark.parametrize("offset_ms", [-SKEW_S * 1000, SKEW_S * 1000, 0])
def test_issued_at_at_the_skew_edge_is_accepted(alice: Ed25519PrivateKey, offset_ms: int) -> None:
    verifier().verify(body_for(alice), NOW + offset_ms)


def test_replayed_id_is_refused(alice: Ed25519PrivateKey) -> None:
    v = verifier()
    body = body_for(alice)
    v.verify(body, NOW)
    with pytest.raises(ReplayedIntent) as err:
        v.verify(copy.deepcopy(body), NOW + 1000)
    assert err.value.code == "replayed_intent" and err.value.http_status == 409
    assert isinstance(err.value, PolicyDenied)


def test_rejected_intent_does_not_poison_the_replay_cache(alice: Ed25519PrivateKey) -> None:
    v = verifier()
    good = body_for(alice)
    forged = copy.deepcopy(good)
    forged["intent"]["text"] = "rm -rf /"
    with pytest.raises(BadSignature):
        v.verify(forged, NOW)
    stale = copy.deepcopy(good)
    with pytest.raises(StaleIntent):
        v.verify(stale, NOW + 3_600_000)
    assert len(v) == 0
    assert v.verify(good, NOW).id == good["intent"]["id"]  # the legitimate intent still goes through


def test_replay_cache_is_bounded(alice: Ed25519PrivateKey) -> None:
    v = verifier(size=50)
    for i in range(200):
        v.verify(_fresh(alice, NOW + i), NOW + 200)  # one ms apart, all inside the window
        assert len(v) <= 50
    assert len(v) == 50


def test_full_cache_fails_closed_for_intents_it_cannot_prove_fresh(alice: Ed25519PrivateKey) -> None:
    v = verifier(size=3)
    bodies = []
    for i in range(4):  # issued 1 s apart; the 4th forces the oldest out while still inside the window
        body = _fresh(alice, NOW + i * 1000)
        v.verify(body, NOW + 3000)
        bodies.append(body)
    with pytest.raises(ReplayedIntent) as err:
        v.verify(bodies[0], NOW + 3000)  # evicted, but its replay is still refused
    assert err.value.details.get("cache_full") is True
    older = new_intent("late", issuer_display="ana@box", issuer_pubkey=public_key_hex(alice), now_ms=NOW - 1000)
    with pytest.raises(ReplayedIntent):
        v.verify({"intent": older, "signature": sign_intent(alice, older)}, NOW + 3000)
    v.verify(_fresh(alice, NOW + 3000), NOW + 3000)  # newer than every forgotten id: accepted


def _fresh(key: Ed25519PrivateKey, at_ms: int) -> dict[str, Any]:
    intent = new_intent("fresh", issuer_display="ana@box", issuer_pubkey=public_key_hex(key), now_ms=at_ms)
    return {"intent": intent, "signature": sign_intent(key, intent)}


def test_old_entries_leave_the_cache_once_outside_the_window(alice: Ed25519PrivateKey) -> None:
    v = verifier()
    v.verify(body_for(alice), NOW)
    v.verify(_fresh(alice, NOW + 2 * SKEW_S * 1000), NOW + 2 * SKEW_S * 1000)
    assert len(v) == 1


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda b: b.__setitem__("intent", "text"), id="intent-not-object"),
        pytest.param(lambda b: b.pop("signature"), id="no-signature"),
        pytest.param(lambda b: b["intent"].__setitem__("extra", 1), id="extra-field"),
        pytest.param(lambda b: b["intent"].pop("parent"), id="missing-field"),
        pytest.param(lambda b: b["intent"].__setitem__("issued_at", 1.5), id="float-time"),
        pytest.param(lambda b: b["intent"].__setitem__("issued_at", True), id="bool-time"),
        pytest.param(lambda b: b["intent"].__setitem__("priority", "urgent"), id="priority"),
        pytest.param(lambda b: b["intent"].__setitem__("id", ""), id="empty-id"),
        pytest.param(lambda b: b["intent"].__setitem__("id", "../../etc/passwd"), id="path-id"),
        pytest.param(lambda b: b["intent"].__setitem__("id", "a" * 129), id="long-id"),
        pytest.param(lambda b: b["intent"].__setitem__("text", "x" * (256 * 1024 + 1)), id="long-text"),
        pytest.param(lambda b: b["intent"].__setitem__("text", "\ud800"), id="lone-surrogate"),
        pytest.param(lambda b: b["intent"]["issuer"].__setitem__("pubkey", "AB" * 32), id="upper-pubkey"),
        pytest.param(lambda b: b["intent"]["issuer"].__setitem__("display", ""), id="empty-display"),
        pytest.param(lambda b: b["intent"]["issuer"].__setitem__("display", "a\nb"), id="control-display"),
    ],
)
def test_malformed_body_is_bad_intent(alice: Ed25519PrivateKey, mutate: Any) -> None:
    body = body_for(alice)
    mutate(body)
    v = verifier()
    with pytest.raises(BadIntent) as err:
        v.verify(body, NOW)
    assert err.value.code == "bad_intent" and err.value.http_status == 400 and err.value.exit_code == 2
    assert len(v) == 0


def test_body_not_an_object_is_bad_intent() -> None:
    with pytest.raises(BadIntent):
        verifier().verify(["intent"], NOW)


def test_bad_priority_in_new_intent() -> None:
    with pytest.raises(BadIntent):
        new_intent("x", issuer_display="a@b", issuer_pubkey="00" * 32, priority="urgent")


def test_intent_ids_are_random_version_4_uuids() -> None:
    import uuid

    from covenant.policy.signing import random_uuid4

    ids = [random_uuid4() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_restored_ids_are_refused_as_replays(alice: Ed25519PrivateKey) -> None:
    body = body_for(alice)
    restarted = verifier()
    kept = restarted.restore([(body["intent"]["id"], NOW), ("old", NOW - SKEW_S * 1000 - 1)], NOW + 1000)
    assert kept == 1  # the old id is outside the window: its replay already fails the skew check
    with pytest.raises(ReplayedIntent):
        restarted.verify(copy.deepcopy(body), NOW + 1000)
    restarted.verify(body_for(alice), NOW + 1000)  # a fresh intent is accepted


def test_restoring_more_ids_than_the_cache_raises_the_floor(alice: Ed25519PrivateKey) -> None:
    restarted = verifier(size=2)
    assert restarted.restore([("a", NOW - 3), ("b", NOW - 2), ("c", NOW - 1)], NOW) == 2
    body = body_for(alice)  # issued at NOW - 0: above the floor, accepted
    restarted.verify(body, NOW)
    older = body_for(alice)
    older["intent"]["issued_at"] = NOW - 3
    older["signature"] = sign_intent(alice, older["intent"])
    with pytest.raises(ReplayedIntent) as err:  # cannot be proven fresh: at or below an evicted id
        restarted.verify(older, NOW)
    assert err.value.details.get("cache_full") is True
