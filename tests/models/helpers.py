"""A gateway under test: providers pointing at fake servers, audit events collected in a list."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from covenant.config import ProviderConfig
from covenant.models import AgentModels, ModelCall, ModelGateway, TokenBudget
from tests.fakes import FakeModelServer

KEY = "sk-test-7f3c9a1e5b2d4f60"


@dataclass
class Recorder:
    """The audit sink and metrics hook, recording what the gateway reports."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    observed: list[tuple[str, str, str, int, int, int]] = field(default_factory=list)

    async def audit(self, type_: str, data: dict[str, Any]) -> None:
        self.events.append((type_, data))

    def observe(self, agent: str, provider: str, outcome: str, input_tokens: int, output_tokens: int,
                attempt: int) -> None:
        self.observed.append((agent, provider, outcome, input_tokens, output_tokens, attempt))

    def calls(self) -> list[dict[str, Any]]:
        return [data for type_, data in self.events if type_ == "model.call"]


def provider(fake: FakeModelServer, kind: str = "openai", **extra: Any) -> ProviderConfig:
    return ProviderConfig(kind=kind, base_url=fake.base_url, **extra)


def gateway(
    providers: Mapping[str, ProviderConfig],
    recorder: Recorder,
    environ: Mapping[str, str] | None = None,
    **kw: Any,
) -> ModelGateway:
    return ModelGateway(providers, environ={} if environ is None else environ, audit=recorder.audit, observe=recorder.observe, **kw)


def model_call(
    *providers: str,
    limit: int = 100_000,
    fallback: str = "next_provider",
    budget: TokenBudget | None = None,
    mapping: dict[str, str] | None = None,
    alias: str | None = None,
) -> ModelCall:
    models = AgentModels(
        providers=providers,
        alias_map=mapping or {"default": "model-a", "fast": "model-b"},
        default_alias="default",
        fallback_policy=fallback,  # type: ignore[arg-type]
    )
    return ModelCall("intent-1", "triage@local", models, budget or TokenBudget(limit), alias)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "classify_ticket",
        "description": "Label a ticket technical or billing.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}
