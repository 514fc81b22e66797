"""``[a2a]`` and ``[[a2a.clients]]`` in covenant.toml (docs/a2a.md)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from covenant.a2a.remotes import RemotePrefix
from covenant.triggers.webhook_config import ListenerLimits, check_env_name, check_listen, check_rate

__all__ = ["A2AClient", "A2AConfig"]


def _public_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{text!r} must be an http(s) URL such as https://agents.example.com (no query, no user)")
    return text.rstrip("/")


def _remote_url(text: str) -> str:
    RemotePrefix.parse(text)  # ValueError naming what is wrong
    return text


def _remote_tokens(table: dict[str, str]) -> dict[str, str]:
    for prefix, env in table.items():
        _remote_url(prefix)
        check_env_name(env)
    return table


def _unique_names(items: tuple[str, ...]) -> tuple[str, ...]:
    twice = sorted({n for n in items if items.count(n) > 1})
    if twice:
        raise ValueError(f"each name may appear once; more than once: {', '.join(twice)}")
    return items


class A2AClient(BaseModel):
    """``[[a2a.clients]]``: one bearer token and the issuer whose grants decide its requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$",
                      description="the client's name in the audit log")
    token_env: Annotated[str, AfterValidator(check_env_name)] = Field(description="daemon env var holding the bearer token")
    issuer: str = Field(min_length=1, description="display name in identities.toml; its grants decide")
    rate: Annotated[str, AfterValidator(check_rate)] = Field("120/minute", description="requests accepted per minute")
    max_body_kb: int | None = Field(None, ge=1, le=65_536, description="this client's body cap; default [a2a] max_body_kb")


def _unique_clients(clients: tuple[A2AClient, ...]) -> tuple[A2AClient, ...]:
    _unique_names(tuple(c.name for c in clients))
    return clients


class A2AConfig(ListenerLimits):
    """``[a2a]``: serving is off unless ``listen`` is set."""

    listen: Annotated[str, AfterValidator(check_listen)] | None = Field(None, description="HOST:PORT; unset: no listener")
    public_url: Annotated[str, AfterValidator(_public_url)] | None = Field(
        None, description="base URL cards advertise; default http://<listen>")
    expose: Annotated[tuple[str, ...], AfterValidator(_unique_names)] = Field(
        default_factory=tuple, description="agents served, by name or id; none by default")
    max_body_kb: int = Field(256, ge=1, le=65_536, description="larger request bodies are answered 413")
    audit_refusals_per_minute: int = Field(60, ge=1, le=100_000,
                                           description="refused requests audited per refusal code a minute")
    clients: Annotated[tuple[A2AClient, ...], AfterValidator(_unique_clients)] = Field(default_factory=tuple)
    remotes: tuple[Annotated[str, AfterValidator(_remote_url)], ...] = Field(
        default_factory=tuple, description="base URLs of remote A2A agents agents may call; none by default")
    remote_tokens: Annotated[dict[str, str], AfterValidator(_remote_tokens)] = Field(
        default_factory=dict, description="URL prefix -> name of the daemon env var holding a bearer for it")
    call_timeout_ms: int = Field(60_000, ge=100, le=3_600_000, description="longest remote call; the caller's deadline is shorter")
    max_answer_kb: int = Field(256, ge=1, le=65_536, description="larger remote answers are refused")

    def base_url(self) -> str:
        """What cards advertise before ``/a2a/NAME``."""
        return self.public_url or f"http://{self.listen}"
