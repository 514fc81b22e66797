"""``[webhooks]`` and ``[[webhooks.routes]]`` in covenant.toml (docs/triggers.md)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = ["ListenerLimits", "WebhookRoute", "WebhooksConfig", "check_env_name", "check_listen", "check_rate",
           "rate_per_minute"]

_RATE = re.compile(r"^([1-9][0-9]{0,5})/minute$")
_LISTEN = re.compile(r"^(\d{1,3}(?:\.\d{1,3}){3}|\[[0-9A-Fa-f:]+\]|localhost):(\d{1,5})$")
_PATH = re.compile(r"^/[A-Za-z0-9._~/-]{0,255}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def rate_per_minute(text: str) -> int:
    match = _RATE.match(text)
    if match is None:
        raise ValueError(f'{text!r} must read "N/minute" with N a whole number from 1, e.g. "60/minute"')
    return int(match.group(1))


def check_rate(text: str) -> str:
    rate_per_minute(text)
    return text


def check_listen(text: str) -> str:
    match = _LISTEN.match(text)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ValueError(f'{text!r} must be HOST:PORT, e.g. "127.0.0.1:8787"')
    return text


def _path(text: str) -> str:
    if not _PATH.match(text) or "//" in text or "/../" in f"{text}/" or "/./" in f"{text}/":
        raise ValueError(f"{text!r} must be a URL path such as /hooks/build (A-Z a-z 0-9 . _ ~ - /)")
    return text


def check_env_name(text: str) -> str:
    if not _ENV.match(text):
        raise ValueError(f"{text!r} must be the name of an environment variable (letters, digits, _), not the secret")
    return text


class WebhookRoute(BaseModel):
    """``[[webhooks.routes]]``: one signed HTTP trigger."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Annotated[str, AfterValidator(_path)] = Field(description="URL path, e.g. /hooks/build")
    agent: str = Field(min_length=1, description="agent id the request is dispatched to")
    issuer: str = Field(min_length=1, description="display name in identities.toml; its grants decide")
    secret_env: Annotated[str, AfterValidator(check_env_name)] = Field(description="daemon env var holding the HMAC secret")
    rate: Annotated[str, AfterValidator(check_rate)] = Field("60/minute", description="accepted requests per minute")


def _unique_paths(routes: tuple[WebhookRoute, ...]) -> tuple[WebhookRoute, ...]:
    paths = [r.path for r in routes]
    twice = sorted({p for p in paths if paths.count(p) > 1})
    if twice:
        raise ValueError(f"route paths must be unique; used more than once: {', '.join(twice)}")
    return routes


class ListenerLimits(BaseModel):
    """What one client may hold of a network listener (``[webhooks]`` and ``[a2a]`` alike): how long it may take
    to send a request, and how many connections it, and everyone together, may keep open."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    header_timeout_s: int = Field(10, ge=1, le=600, description="a request head must be whole within this")
    body_timeout_s: int = Field(30, ge=1, le=3600, description="a request body must be whole within this of its head")
    max_connections: int = Field(256, ge=1, le=65_536, description="open connections of the listener, from anyone")
    max_connections_per_source: int = Field(32, ge=1, le=65_536, description="open connections from one address")


class WebhooksConfig(ListenerLimits):
    """``[webhooks]``: off unless ``listen`` is set."""

    listen: Annotated[str, AfterValidator(check_listen)] | None = Field(None, description="HOST:PORT; unset: no listener")
    skew_s: int = Field(300, ge=1, le=86_400, description="accepted age of the signature's t, either way")
    max_body_kb: int = Field(256, ge=1, le=65_536, description="larger bodies are answered 413")
    audit_refusals_per_minute: int = Field(60, ge=1, le=100_000,
                                           description="refused requests audited per route and refusal code a minute")
    routes: Annotated[tuple[WebhookRoute, ...], AfterValidator(_unique_paths)] = Field(default_factory=tuple)
