"""``[fleet]`` in covenant.toml: how this host's ``covenant fleet`` reaches NATS (docs/fleet.md).

No ``servers`` means no fleet: ``covenant fleet`` and ``dispatch --fleet`` refuse
to start and say which key to set. Credentials never live in this file: a
server URL with a user or password is refused, and ``creds_env`` names the
environment variable that holds the *path* of a NATS ``.creds`` file.
"""

from __future__ import annotations

import re
import socket
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from covenant.errors import ConfigError

__all__ = ["FleetConfig", "HOST_PATTERN", "check_server_url", "default_host"]

_SERVER = re.compile(r"^(nats|tls)://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\])(:\d{1,5})?$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
HOST_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
"""A host name in the fleet: a KV key and (token-encoded) a subject token, so no spaces, ``*`` or ``>``."""


def check_server_url(text: str) -> str:
    """``nats://HOST[:PORT]`` or ``tls://HOST[:PORT]``; a user or password in the URL is refused unrepeated."""
    if "@" in text:
        # Not echoed: what is before the @ may be a password.
        raise ValueError("a server URL must not carry a user or password; put them in a .creds file named by creds_env")
    if not _SERVER.match(text):
        raise ValueError(f"{text!r} must be nats://HOST[:PORT] or tls://HOST[:PORT], e.g. nats://10.0.0.5:4222")
    return text


def _check_env(text: str) -> str:
    if not _ENV.match(text):
        raise ValueError("must be the name of an environment variable (letters, digits, _), not the credentials")
    return text


def _check_host(text: str) -> str:
    if not HOST_PATTERN.match(text):
        raise ValueError(f"{text!r} must be 1-63 of A-Z a-z 0-9 _ . - starting with a letter or digit")
    return text


def default_host() -> str:
    """This machine's hostname, the default ``[fleet] host``."""
    return socket.gethostname()


class FleetConfig(BaseModel):
    """``[fleet]``: the NATS servers, this host's name in the fleet, delivery settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    servers: tuple[Annotated[str, AfterValidator(check_server_url)], ...] = Field(
        (), description="NATS URLs (nats:// or tls://); none: no fleet")
    host: Annotated[str, AfterValidator(_check_host)] | None = Field(
        None, description="this host's name in the fleet, unique; default the machine's hostname")
    replicas: int = Field(3, ge=1, le=5, description="JetStream replicas of the streams and buckets this host creates")
    ack_wait_s: int = Field(30, ge=1, le=3600, description="an intent unacknowledged this long is redelivered")
    max_deliver: int = Field(5, ge=1, le=100, description="deliveries before an intent is answered delivery_exhausted")
    max_in_flight: int = Field(8, ge=1, le=10_000, description="intents of one agent this host runs at once at most")
    creds_env: Annotated[str, AfterValidator(_check_env)] | None = Field(
        None, description="env var holding the path of a NATS .creds file")
    tls_ca: str | None = Field(None, min_length=1, description="CA bundle (PEM) that signs the servers' certificates")
    tls_cert: str | None = Field(None, min_length=1, description="client certificate (PEM), with tls_key")
    tls_key: str | None = Field(None, min_length=1, description="client private key (PEM), with tls_cert")

    @model_validator(mode="after")
    def _cert_with_key(self) -> "FleetConfig":
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both, or neither")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.servers)

    def host_name(self) -> str:
        """``host``, else the machine's hostname; a hostname that cannot be a fleet name is a ConfigError."""
        if self.host is not None:
            return self.host
        name = default_host()
        if not HOST_PATTERN.match(name):
            raise ConfigError(f"the hostname {name!r} cannot name this host in the fleet; set [fleet] host in covenant.toml",
                              field="fleet.host")
        return name

    def require(self, config_path: object) -> "FleetConfig":
        """Self, or a ConfigError naming the file when ``servers`` is not set."""
        if not self.enabled:
            raise ConfigError(
                f"{config_path}: [fleet] servers is not set, so this host is in no fleet; add e.g. "
                '[fleet] servers = ["nats://10.0.0.5:4222"] (docs/fleet.md)', field="fleet.servers")
        return self
