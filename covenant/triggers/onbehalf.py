"""An intent the daemon signs on an issuer's behalf, dispatched like any other.

The issuer named in the intent is the identity whose grants decide it; the
signature is the daemon's own (a schedule or webhook has no issuer key to
sign with). ``Daemon.dispatch(..., daemon_signer=<daemon pubkey>)`` verifies
it against the daemon's key, then routes, decides and audits it exactly as a
signed request from a client. A client cannot reach this path: the socket API
never passes ``daemon_signer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.errors import ConfigError
from covenant.keys import public_key_hex
from covenant.policy.signing import new_intent, sign_intent

__all__ = ["Dispatcher", "OnBehalfSigner", "issuer_pubkey", "secret_from_env"]


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


def issuer_pubkey(known: Mapping[str, str], display: str, *, where: str, field: str) -> str:
    """The public key ``identities.toml`` records for ``display``; ConfigError naming ``where`` otherwise."""
    pubkey = known.get(display)
    if pubkey is None:
        raise ConfigError(f"{where}: issuer {display!r} is not a display name in identities.toml "
                          "(record it with `covenant identity add NAME PUBKEY`)", field=field)
    return pubkey


def secret_from_env(environ: Mapping[str, str], name: str, *, where: str, field: str, what: str,
                    min_chars: int = 1) -> str:
    """A secret the daemon's environment holds under ``name``; ConfigError when it is unset or short."""
    value = environ.get(name, "")
    if len(value) < min_chars:
        least = f" of at least {min_chars} characters" if min_chars > 1 else ""
        raise ConfigError(f"{where}: the daemon's environment has no {name}{least} "
                          f"({field.rpartition('.')[2]} names the variable holding {what})", field=field)
    return value
