"""The intent model and the verifier the daemon runs on every dispatch body.

Checks, in this order: shape, signature, clock skew, replay. A body rejected
at any step never reaches the replay cache, so a forged or stale intent
cannot burn the id of a legitimate one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from covenant.policy.errors import BadIntent, BadSignature, StaleIntent
from covenant.policy.replay_cache import ReplayCache
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from covenant.policy.signing import (
    ID_PATTERN,
    MAX_AGENT_CHARS,
    MAX_DISPLAY_CHARS,
    MAX_ID_CHARS,
    MAX_TEXT_CHARS,
    PUBKEY_PATTERN,
    display_problem,
    intent_signing_bytes,
    signature_matches,
)

__all__ = ["Intent", "Issuer", "IntentVerifier", "sign_child_intent", "verify_child_intent"]

IntentId = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS, pattern=ID_PATTERN)]

# issued_at is ms since the epoch; 2**53 keeps it exact in every JSON reader.
MAX_TIMESTAMP_MS = 2**53 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Issuer(_Strict):
    """Who signed: ``pubkey`` is the identity, ``display`` only a label."""

    display: str = Field(min_length=1, max_length=MAX_DISPLAY_CHARS)
    pubkey: str = Field(pattern=PUBKEY_PATTERN)

    @field_validator("display")
    @classmethod
    def _display_ok(cls, value: str) -> str:
        problem = display_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class Intent(_Strict):
    """One signed request to run an agent (DESIGN.md §7b)."""

    id: IntentId
    text: str = Field(max_length=MAX_TEXT_CHARS)
    agent: str | None = Field(default=..., min_length=1, max_length=MAX_AGENT_CHARS)
    issuer: Issuer
    issued_at: int = Field(ge=0, le=MAX_TIMESTAMP_MS)
    priority: Literal["low", "normal", "high"]
    parent: IntentId | None = Field(default=...)

    @field_validator("text")
    @classmethod
    def _text_encodable(cls, value: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text must be valid Unicode (no lone surrogates)") from None
        return value


def _shape_problems(exc: ValidationError) -> list[str]:
    return [f"{'.'.join(str(p) for p in err['loc']) or '(intent)'}: {err['msg']}" for err in exc.errors()]


class IntentVerifier:
    """Verifies dispatch bodies and remembers accepted intent ids.

    ``skew_s`` is the accepted distance between ``issued_at`` and the daemon's
    clock, either way. ``replay_cache_size`` bounds the remembered ids.
    Safe to call from several threads.
    """

    def __init__(self, skew_s: int, replay_cache_size: int) -> None:
        self.skew_ms = skew_s * 1000
        # An id older than the skew window fails the skew check before the cache is asked: the cache
        # need not remember it any longer. (It refuses a window or a size that is not positive.)
        self._replays = ReplayCache(self.skew_ms, replay_cache_size)

    def __len__(self) -> int:
        return len(self._replays)

    def verify(self, body: Any, now_ms: int, *, signer: str | None = None) -> Intent:
        """Return the verified intent, or raise BadIntent, BadSignature, StaleIntent or ReplayedIntent.

        ``signer``: the daemon's public key, for an intent it signed itself on its issuer's behalf.
        """
        intent, message = self._check_shape(body)
        if not signature_matches(message, body["signature"], signer if signer is not None else intent.issuer.pubkey):
            raise BadSignature(
                f"intent {intent.id}: signature does not verify against issuer public key "
                f"{intent.issuer.pubkey} (the intent was altered, or signed by another key)",
                intent_id=intent.id,
                pubkey=intent.issuer.pubkey,
            )
        self._check_skew(intent, now_ms)
        self._replays.remember(intent.id, intent.issued_at, now_ms)
        return intent

    def restore(self, seen: Iterable[tuple[str, int]], now_ms: int) -> int:
        """Remember ``(intent id, issued_at)`` pairs accepted before a restart; returns how many are kept.

        Replay protection across restarts: the daemon feeds the ids of the
        last skew window, read back from its durable audit log, before it
        serves anyone. Ids already outside the window are dropped (their
        replay fails the skew check); past ``replay_cache_size`` the oldest
        are forgotten and raise the floor, exactly as at run time.
        """
        return self._replays.restore(seen, now_ms)

    def _check_shape(self, body: Any) -> tuple[Intent, bytes]:
        """The intent, validated, and the bytes its signature covers (BadIntent if they cannot be encoded)."""
        if not isinstance(body, dict):
            raise BadIntent('dispatch body must be a JSON object {"intent": {...}, "signature": "<hex>"}')
        raw = body.get("intent")
        if not isinstance(raw, dict):
            raise BadIntent('dispatch body needs "intent": an object', field="intent")
        if not isinstance(body.get("signature"), str):
            raise BadIntent('dispatch body needs "signature": the hex Ed25519 signature', field="signature")
        try:
            intent = Intent.model_validate(raw)
        except ValidationError as exc:
            problems = _shape_problems(exc)
            raise BadIntent(f"malformed intent: {'; '.join(problems)}", problems=problems) from None
        return intent, intent_signing_bytes(raw)

    def _check_skew(self, intent: Intent, now_ms: int) -> None:
        delta = intent.issued_at - now_ms
        if abs(delta) <= self.skew_ms:
            return
        direction = "in the future" if delta > 0 else "in the past"
        raise StaleIntent(
            f"intent {intent.id}: issued_at is {abs(delta) // 1000} s {direction}; the accepted clock skew is "
            f"±{self.skew_ms // 1000} s (check the clocks of the issuing host and the daemon, then dispatch again)",
            intent_id=intent.id,
            issued_at=intent.issued_at,
            now_ms=now_ms,
            skew_s=self.skew_ms // 1000,
        )

# -- child intents: made and signed by the daemon, never received -------------------------------


def sign_child_intent(key: Ed25519PrivateKey, intent: Intent) -> str:
    """The daemon's hex signature over a child intent it built on the root issuer's behalf.

    A child intent carries the root issuer in ``issuer`` but is signed by the
    daemon's key, so :meth:`IntentVerifier.verify` (which checks against
    ``issuer.pubkey``) rejects it when it is sent to the control socket: the
    only way in is the daemon's own child path, which builds it itself.
    """
    if intent.parent is None:
        raise BadIntent("a child intent needs its parent's id", field="parent")
    return key.sign(intent_signing_bytes(intent.model_dump(mode="json"))).hex()


def verify_child_intent(daemon_key: Ed25519PublicKey, intent: Intent, signature: str) -> None:
    """Raise BadSignature unless ``signature`` is the daemon's over ``intent`` (a child intent)."""
    try:
        daemon_key.verify(bytes.fromhex(signature), intent_signing_bytes(intent.model_dump(mode="json")))
    except (ValueError, InvalidSignature):
        raise BadSignature(
            f"child intent {intent.id}: not signed by this daemon's key", intent_id=intent.id
        ) from None
