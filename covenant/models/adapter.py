"""What a provider adapter does: build one request, read one answer, plain or streamed.

Adapters are pure (no I/O): the gateway owns the HTTP client, timeouts, retries and audit.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from covenant.config import ProviderConfig
from covenant.sse import SseEvent
from covenant.models.types import Answer, ProviderProtocolError

__all__ = ["Adapter", "StreamAssembler", "HttpRequest", "ChatTurn", "tool_call", "arguments_text", "require"]

HttpRequest = tuple[str, dict[str, str], dict[str, Any]]
"""(url, headers, JSON body)."""


def require(condition: bool, what: str) -> None:
    if not condition:
        raise ProviderProtocolError(what)


def arguments_text(arguments: Any) -> str:
    """Tool-call arguments as JSON text, whatever shape the provider sent them in."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """One tool call in the neutral format."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments_text(arguments)}}


class StreamAssembler(ABC):
    """Fed the stream's events in order; collects text and tool calls into one :class:`Answer`."""

    done: bool = False

    @abstractmethod
    def feed(self, event: SseEvent) -> str | None:
        """Take one event; return the text it adds (for ``on_token``), if any."""

    @abstractmethod
    def answer(self) -> Answer:
        """The whole turn, once the stream ended."""


@dataclass(frozen=True)
class ChatTurn:
    """What one chat turn asks of the provider, in the neutral format."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    stream: bool


class Adapter(ABC):
    """One provider wire format."""

    kind: str
    path: str
    """Appended to the provider's ``base_url``."""

    def request(
        self,
        config: ProviderConfig,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        key: str | None,
        stream: bool,
    ) -> HttpRequest:
        """The request for one chat turn; ``key`` goes only into the provider's auth header."""
        headers = {"content-type": "application/json", "accept": "text/event-stream" if stream else "application/json"}
        headers.update(self.headers(config, key))
        return f"{config.base_url}{self.path}", headers, self.body(config, ChatTurn(model, messages, tools, stream))

    @abstractmethod
    def headers(self, config: ProviderConfig, key: str | None) -> dict[str, str]:
        """The provider's own headers: its auth header when there is a ``key``, its version header."""

    @abstractmethod
    def body(self, config: ProviderConfig, turn: ChatTurn) -> dict[str, Any]:
        """The JSON body for ``turn``."""

    @abstractmethod
    def answer(self, data: Any) -> Answer:
        """A non-streamed response body (parsed JSON) as an :class:`Answer`."""

    @abstractmethod
    def assembler(self) -> StreamAssembler:
        """A fresh assembler for one streamed response."""

    @abstractmethod
    def error_message(self, data: Any) -> str | None:
        """The human message inside an error response body, when there is one."""
