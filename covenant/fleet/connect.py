"""A NATS connection from ``[fleet]``: servers, a ``.creds`` file named by ``creds_env``, TLS.

Nothing here logs or returns a credential: errors name the variable or the file,
never what is in them.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from covenant.errors import ConfigError, CovenantError, ExitCode
from covenant.fleet.config import FleetConfig

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = ["NatsUnreachable", "connect_options", "connect"]

log = logging.getLogger("covenant.fleet")


class NatsUnreachable(CovenantError):
    """No NATS server of ``[fleet] servers`` answered."""

    code = "nats_unreachable"
    exit_code = ExitCode.UNREACHABLE


def _tls_context(config: FleetConfig) -> ssl.SSLContext | None:
    wants_tls = any(url.startswith("tls://") for url in config.servers)
    if not (wants_tls or config.tls_ca or config.tls_cert):
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        if config.tls_ca:
            context.load_verify_locations(cafile=config.tls_ca)
        if config.tls_cert and config.tls_key:
            context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        # The error names the file (tls_ca, tls_cert or tls_key), never key material.
        raise ConfigError(f"[fleet] TLS files cannot be loaded ({type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}); "
                          "check tls_ca, tls_cert and tls_key", field="fleet.tls_ca") from None
    return context


def _creds_file(config: FleetConfig, environ: Mapping[str, str]) -> str | None:
    if config.creds_env is None:
        return None
    path = environ.get(config.creds_env)
    if not path:
        raise ConfigError(f"[fleet] creds_env names {config.creds_env}, which is not set in this environment; set it to "
                          "the path of the NATS .creds file", field="fleet.creds_env")
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ConfigError(f"the .creds file that {config.creds_env} names cannot be read; check the path and its "
                          "permissions", field="fleet.creds_env")
    return path


def connect_options(config: FleetConfig, name: str, environ: Mapping[str, str] | None = None,
                    *, keep_trying: bool) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect``.

    ``keep_trying``: the per-host process reconnects for ever (a NATS node restart
    or a network blip never needs a covenant restart); a CLI command gives up after
    one round over the servers, so it can say NATS is unreachable.
    """
    options: dict[str, Any] = {
        "servers": list(config.servers),
        "name": name,
        "connect_timeout": 2,
        "allow_reconnect": True,
        "reconnect_time_wait": 1,
        "max_reconnect_attempts": -1 if keep_trying else 1,
        # A dead server is noticed within ~10 s even without traffic (two missed pings).
        "ping_interval": 5,
        "max_outstanding_pings": 2,
    }
    creds = _creds_file(config, os.environ if environ is None else environ)
    if creds is not None:
        options["user_credentials"] = creds
    context = _tls_context(config)
    if context is not None:
        options["tls"] = context
    return options


class _ErrorLog:
    """nats-py reports every failed attempt (about one a second per server while they are away): log the
    first, then at most one every 30 s with how many were left out."""

    EVERY_S = 30.0

    def __init__(self) -> None:
        self._last = -self.EVERY_S
        self._quiet = 0

    async def report(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._last < self.EVERY_S:
            self._quiet += 1
            return
        log.warning("NATS connection problem", extra={"error": f"{type(exc).__name__}: {exc}",
                                                       "since_last_logged": self._quiet})
        self._last, self._quiet = now, 0


async def connect(config: FleetConfig, name: str, *, keep_trying: bool, **callbacks: Any) -> "Client":
    """A connected nats-py client, or NatsUnreachable naming the servers."""
    import nats
    from nats.errors import NoServersError

    options = connect_options(config, name, keep_trying=keep_trying)
    callbacks.setdefault("error_cb", _ErrorLog().report)  # nats-py wants a coroutine function
    try:
        return await nats.connect(**options, **callbacks)
    except (NoServersError, OSError, TimeoutError) as exc:
        raise NatsUnreachable(
            f"no NATS server of [fleet] servers answered ({', '.join(config.servers)}): {type(exc).__name__}; "
            "check that they run and that this host reaches them",
            servers=list(config.servers),
        ) from None
