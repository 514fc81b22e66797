"""An intent the daemon signs on an issuer's behalf, dispatched like any other.

The issuer named in the intent is the identity whose grants decide it; the
signature is the daemon's own (a schedule or webhook has no issuer key to
sign with). ``Daemon.dispatch(..., daemon_signer=<daemon pubkey>)`` verifies
it against the daemon's key, then routes, decides and audits it exactly as a
signed request from a client. A client cannot reach this path: the socket API
never passes ``daemon_signer``.
"""

from __future__ import annotations

from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.keys import public_key_hex
from covenant.policy.signing import new_intent, sign_intent

__all__ = ["Dispatcher", "OnBehalfSigner"]


class Dispatcher(Protocol):
    async def dispatch(self, body: dict[str, Any], *, daemon_signer: str | None = None) -> dict[str, Any]: ...


class OnBehalfSigner:
    """Builds and signs intents for a named issuer with the daemon's key."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.pubkey = public_key_hex(key)

    def body(self, text: str, *, agent: str, issuer_display: str, issuer_pubkey: str, now_ms: int) -> dict[str, Any]:
        """The dispatch body (``intent`` + ``signature``) of one firing."""
        intent = new_intent(text, issuer_display=issuer_display, issuer_pubkey=issuer_pubkey, agent=agent, now_ms=now_ms)
        return {"intent": intent, "signature": sign_intent(self._key, intent)}

    async def dispatch(self, daemon: Dispatcher, body: dict[str, Any]) -> dict[str, Any]:
        return await daemon.dispatch(body, daemon_signer=self.pubkey)
