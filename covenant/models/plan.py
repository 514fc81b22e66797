"""Which provider and model a Rune agent's model call would use, and why others are skipped.

Pure: reads the providers' config and the daemon's environment (only whether a key variable is
set and usable, never its value in any output). ``dispatch --dry-run`` and ``agents show`` print it;
the gateway follows it for every call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from covenant.config import ProviderConfig
from covenant.models.types import AgentModels

__all__ = ["ModelPlan", "PlannedProvider", "SkippedProvider", "plan_models", "usable_key"]

# What an HTTP header value may hold; anything else would make h11 raise an error that
# quotes the value, so such a key is refused before any request is built.
_HEADER_SAFE = re.compile(r"^[\x21-\x7e]{1,4096}$")


def usable_key(value: str | None) -> bool:
    return value is not None and bool(_HEADER_SAFE.match(value))


@dataclass(frozen=True)
class PlannedProvider:
    provider: str
    kind: str
    base_url: str
    model: str


@dataclass(frozen=True)
class SkippedProvider:
    provider: str
    reason: str


@dataclass(frozen=True)
class ModelPlan:
    """``attempts`` in the order they would be tried; ``problem`` says why there are none."""

    alias: str
    model: str | None
    attempts: tuple[PlannedProvider, ...]
    skipped: tuple[SkippedProvider, ...]
    problem: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "model": self.model,
            "providers": [
                {"provider": p.provider, "kind": p.kind, "base_url": p.base_url, "model": p.model} for p in self.attempts
            ],
            "skipped": [{"provider": s.provider, "reason": s.reason} for s in self.skipped],
            "problem": self.problem,
        }


def _skip_reason(name: str, config: ProviderConfig | None, environ: Mapping[str, str]) -> str | None:
    if config is None:
        return f"no [providers.{name}] table in covenant.toml"
    if config.api_key_env is not None:
        value = environ.get(config.api_key_env)
        if not value:
            return f"the daemon's environment variable {config.api_key_env} (api_key_env) is not set"
        if not usable_key(value):
            return f"the value of {config.api_key_env} (api_key_env) is not a usable key: printable ASCII, no spaces"
    return None


def plan_models(
    models: AgentModels,
    providers: Mapping[str, ProviderConfig],
    environ: Mapping[str, str],
    alias: str | None = None,
) -> ModelPlan:
    """The providers a call would try, in order, each with the model id it would be sent.

    That id is the one the alias maps to, unless the provider's ``model`` pins its own.
    """
    alias = alias or models.default_alias
    model = models.alias_map.get(alias)
    if model is None:
        known = ", ".join(sorted(models.alias_map)) or "none"
        return ModelPlan(alias, None, (), (), f"model alias {alias!r} is not a key of models.model_mapping (known: {known})")
    if not models.providers:
        return ModelPlan(
            alias, model, (), (),
            "the Runefile lists no models.providers; list one and add its [providers.NAME] table to covenant.toml",
        )
    attempts: list[PlannedProvider] = []
    skipped: list[SkippedProvider] = []
    for name in models.providers:
        config = providers.get(name)
        reason = _skip_reason(name, config, environ)
        if reason is not None:
            skipped.append(SkippedProvider(name, reason))
        else:
            assert config is not None
            attempts.append(PlannedProvider(name, config.kind, config.base_url, config.model or model))
    problem = None
    if not attempts:
        listed = ", ".join(models.providers)
        first = models.providers[0]
        problem = (
            f"no usable provider among models.providers ({listed}): "
            + "; ".join(f"{s.provider}: {s.reason}" for s in skipped)
            + f". Add e.g. [providers.{first}] with kind, base_url and api_key_env to covenant.toml"
            " (docs/providers.md) and set the key variable in the daemon's environment"
        )
    return ModelPlan(alias, model, tuple(attempts), tuple(skipped), problem)
