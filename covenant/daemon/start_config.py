"""covenant.toml as ``covenant daemon`` needs it, with every problem of the file named at once.

Validating the file (:func:`covenant.config.load_config`) already reports every wrong key and value in
one pass. What it names is then resolved against the home and the daemon's environment: the issuers
of ``[[schedules]]``, ``[[webhooks.routes]]`` and ``[[a2a.clients]]`` in identities.toml, the route
secrets and client tokens in the environment. Those problems are gathered with the first pass's, so a
file with a wrong type, an unknown issuer and an unset secret fails one start naming all three, not
three starts one each. When the file does not validate as a whole, each of those three sections is
still checked on its own if it validates alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from covenant.a2a.config import A2AConfig
from covenant.a2a.server import Client as A2AClient, resolve_clients
from covenant.config import Config, load_config
from covenant.errors import ConfigError, ConfigProblems
from covenant.home import Home
from covenant.policy.identities import KnownIdentities
from covenant.triggers.config import ScheduleConfig
from covenant.triggers.schedules import resolve_issuers
from covenant.triggers.webhook_config import WebhooksConfig
from covenant.triggers.webhooks import resolve_routes

__all__ = ["StartConfig", "load_start_config"]

_HINT = "(docs/configuration.md lists every key; fix the file and start again)"


@dataclass(frozen=True)
class StartConfig:
    """The validated file and what its sections name, resolved."""

    config: Config
    schedule_issuers: dict[str, str]
    webhook_routes: dict[str, Any]
    """path -> the route with its secret and issuer key (covenant.triggers.webhooks)."""
    a2a_clients: list[A2AClient]


@dataclass(frozen=True)
class _Named:
    """The sections that name identities and secrets, from the whole file or each validated alone."""

    schedules: tuple[ScheduleConfig, ...] | None
    webhooks: WebhooksConfig | None
    a2a: A2AConfig | None


def load_start_config(home: Home, environ: Mapping[str, str] = os.environ) -> StartConfig:
    """covenant.toml loaded and resolved; one ConfigError naming every problem (a line each) otherwise."""
    problems = ConfigProblems()
    config = None
    with problems.gathered():
        config = load_config(home)
    if config is not None:
        named = _Named(config.schedules, config.webhooks, config.a2a)
    else:
        try:
            named = _alone(home)
        except ConfigError:  # not TOML at all: nothing more can be read from it
            problems.raise_any()
            raise
    known: dict[str, str] = KnownIdentities(home).all()
    issuers: dict[str, str] = {}
    routes: dict[str, Any] = {}
    clients: list[A2AClient] = []
    where = str(home.config_path)
    if named.schedules is not None:
        with _located(problems, where):
            issuers = resolve_issuers(named.schedules, known)
    if named.webhooks is not None:
        with _located(problems, where):
            routes = resolve_routes(named.webhooks, known, environ)
    if named.a2a is not None:
        with _located(problems, where):
            clients = resolve_clients(named.a2a, known, environ)
    if len(problems.errors) > 1:  # the hint once, at the end
        for error in problems.errors:
            error.message = error.message.replace("\n" + _HINT, "")
        problems.errors[-1].message += "\n" + _HINT
    problems.raise_any()
    assert config is not None
    return StartConfig(config, issuers, routes, clients)


@contextmanager
def _located(problems: ConfigProblems, where: str) -> Iterator[None]:
    """Gather a resolver's ConfigError with the file's path in front of each of its lines."""
    try:
        yield
    except ConfigError as exc:
        exc.message = "\n".join(f"{where}: {line}" for line in exc.message.split("\n"))
        problems.errors.append(exc)


def _alone(home: Home) -> _Named:
    """Each of ``schedules``, ``webhooks`` and ``a2a`` that validates in a file holding only it (None if not)."""
    raw = home.raw_config()

    def section(key: str) -> Any:
        if key not in raw:
            return getattr(Config(), key)
        try:
            return getattr(Config.model_validate_json(json.dumps({key: raw[key]}, default=str), strict=True), key)
        except ValueError:  # pydantic's ValidationError: already reported by load_config
            return None

    return _Named(section("schedules"), section("webhooks"), section("a2a"))
