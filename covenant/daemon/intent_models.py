"""An intent's model calls lent to its tools (:class:`covenant.tools.context.IntentModels`): ``rune@image-analyze``
asks the agent's own model about an image, ``rune@image-generate`` asks a provider's images endpoint.

Both go through the daemon's :class:`~covenant.models.ModelGateway` exactly as the replica's turns do: the agent's
providers and fallback, the intent's token budget, the key only in the auth header, one ``model.call`` event per
provider attempt. A gateway refusal comes back to the model as the tool's error, never as a crash of the call.
"""

from __future__ import annotations

from typing import Any

from covenant.daemon.intent_context import IntentContext
from covenant.models import AgentModels, ModelCall, ModelError, ModelGateway, TokenBudget
from covenant.tools.result import ToolError

__all__ = ["GatewayModels", "intent_budget"]


def intent_budget(intent: IntentContext) -> TokenBudget:
    """The intent's token budget, made on its first model call (the replica's or a tool's)."""
    budget = intent.state.get("budget")
    if budget is None:
        budget = intent.state["budget"] = TokenBudget(intent.package.runefile.models.token_budget)
    return budget


class GatewayModels:
    """One intent's :class:`~covenant.tools.context.IntentModels`, over the daemon's gateway."""

    def __init__(self, gateway: ModelGateway, intent: IntentContext) -> None:
        self._gateway = gateway
        self._intent = intent

    def _call(self) -> ModelCall:
        intent = self._intent
        return ModelCall(intent.intent_id, intent.agent.id, AgentModels.from_runefile(intent.package.runefile),
                         intent_budget(intent))

    async def ask(self, messages: list[dict[str, Any]]) -> str:
        try:
            result = await self._gateway.chat(self._call(), messages, [])
        except ModelError as exc:
            raise ToolError("tool_failed", f"the model call failed ({exc.code}): {exc.message}") from None
        content = result.message.get("content")
        return content if isinstance(content, str) else ""

    async def generate_image(self, provider: str, model: str, prompt: str, size: str | None) -> bytes:
        try:
            return await self._gateway.generate_image(self._call(), provider, model, prompt, size)
        except ModelError as exc:
            raise ToolError("tool_failed", f"the images endpoint failed ({exc.code}): {exc.message}") from None
