"""The gateway's vocabulary: what the loop asks for, what it gets back, how a call fails.

The neutral message format between the loop and the gateway is OpenAI chat completions:
``messages`` as ``{"role": "system"|"user"|"assistant"|"tool", …}`` and ``tools`` as
``[{"type": "function", "function": {"name", "description", "parameters"}}]``. One extension:
a ``tool`` message may carry ``"is_error": true`` (its content then holds
``{"error": {"code", "message"}}``); the OpenAI adapter drops the key, the Anthropic adapter turns
it into ``tool_result.is_error``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "AuditSink",
    "CallObserver",
    "TokenBudget",
    "AgentModels",
    "ModelCall",
    "ChatResult",
    "ModelError",
    "ModelErrorCode",
    "Answer",
    "ProviderProtocolError",
]

AuditSink = Callable[[str, dict[str, Any]], Awaitable[None]]
"""``await audit(event_type, data)``: the daemon records it in the signed log."""

CallObserver = Callable[[str, str, str, int, int, int], None]
"""``observe(agent, provider, outcome, input_tokens, output_tokens, attempt)`` once per provider attempt (metrics):
``outcome`` is ``ok`` or how the attempt failed (``rate_limited``, ``http_error``, ``timeout``, ``unreachable``,
``bad_answer``, ``impostor``, ``interrupted``); ``attempt`` counts from 1 within one model call (retries and
fallbacks are 2 and up)."""

ModelErrorCode = Literal["token_budget_exceeded", "provider_error", "provider_unavailable", "protocol_error"]


@dataclass
class TokenBudget:
    """Tokens (input + output, from each response's usage) one intent may spend.

    One object per intent, shared by every model call of it, retries and fallbacks included.
    A call is refused before it is made only when ``used >= limit``; the answer that crosses
    the limit is still returned (it was paid for), and the next call is refused.
    """

    limit: int
    used: int = 0

    @property
    def spent(self) -> bool:
        return self.used >= self.limit

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)


@dataclass(frozen=True)
class AgentModels:
    """The models a Rune agent may use: its Runefile's ``models`` section and ``default_model``."""

    providers: tuple[str, ...]
    alias_map: dict[str, str]
    default_alias: str
    fallback_policy: Literal["next_provider", "fail"] = "next_provider"

    @classmethod
    def from_runefile(cls, runefile: Any) -> AgentModels:
        """From a validated :class:`covenant.manifest.runefile.Runefile`."""
        models = runefile.models
        return cls(
            providers=tuple(models.providers),
            alias_map=dict(models.model_mapping),
            default_alias=runefile.default_model,
            fallback_policy=models.fallback_policy,
        )


@dataclass(frozen=True)
class ModelCall:
    """Who is asking (for audit, metrics and the budget) and which alias to use (default: the agent's)."""

    intent_id: str
    agent_id: str
    models: AgentModels
    budget: TokenBudget
    alias: str | None = None
    adapter: str | None = None
    """An adapter id (the test-driven loop's first ``adapter_ids`` entry): each provider sends it as its
    ``[providers.X] adapters`` maps it; a provider that maps no such id is skipped."""


@dataclass(frozen=True)
class ChatResult:
    """One assistant turn in the neutral (OpenAI) format.

    ``message`` is ``{"role": "assistant", "content": str, "tool_calls": [...]}``: ``content`` is
    ``""`` rather than null, ``tool_calls`` always present (possibly empty), each
    ``{"id", "type": "function", "function": {"name", "arguments": <JSON text>}}``.
    """

    message: dict[str, Any]
    input_tokens: int
    output_tokens: int
    provider: str
    model: str

    @property
    def text(self) -> str:
        return str(self.message.get("content") or "")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.message.get("tool_calls") or [])


class ModelError(Exception):
    """A model call that produced no answer.

    ``code``: ``token_budget_exceeded`` (the intent's budget was already spent; no request made),
    ``provider_unavailable`` (no provider could be tried: none configured, key variable unset,
    unknown alias), ``provider_error`` (providers were tried and failed), ``protocol_error`` (the
    messages or tools the replica sent are malformed; nothing was sent). ``message`` never holds
    a key value.
    """

    def __init__(self, code: ModelErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ModelErrorCode = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass
class Answer:
    """What an adapter made of one provider response; usage None when the provider sent none."""

    message: dict[str, Any]
    input_tokens: int | None = None
    output_tokens: int | None = None


class ProviderProtocolError(Exception):
    """A provider's answer did not follow its wire format."""
