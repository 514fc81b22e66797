"""Anthropic messages: ``POST {base_url}/messages`` with ``x-api-key`` and ``anthropic-version``.

Converts the neutral (OpenAI-format) turn both ways: system messages → ``system``; assistant
``tool_calls`` → ``tool_use`` blocks; ``tool`` messages → ``tool_result`` blocks in a user turn
(``is_error`` kept); consecutive turns of one role merged, as the API requires alternation.
"""

from __future__ import annotations

import json
from typing import Any

from covenant import outside_json
from covenant.config import ProviderConfig
from covenant.models.adapter import Adapter, ChatTurn, StreamAssembler, require, tool_call
from covenant.sse import SseEvent
from covenant.models.types import Answer, ProviderProtocolError
from covenant.models.validate import IMAGE_DATA_URL

__all__ = ["AnthropicAdapter", "DEFAULT_MAX_TOKENS", "to_anthropic"]

DEFAULT_MAX_TOKENS = 4096
"""Anthropic requires ``max_tokens``; sent when the provider sets no ``max_output_tokens``."""


def _text(content: Any) -> str:
    """Text of an OpenAI-format content: a string or a list of ``{"type": "text", "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ValueError("only text content parts can be sent to an anthropic provider")
            parts.append(part["text"])
        return "".join(parts)
    raise ValueError(f"message content must be text, not {type(content).__name__}")


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    """A user message's content as Anthropic blocks: text, and each inline image as an image block (base64)."""
    if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") == "image_url" for p in content):
        text = _text(content)
        return [{"type": "text", "text": text}] if text else []
    blocks: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            match = IMAGE_DATA_URL.match(str((part.get("image_url") or {}).get("url", "")))
            if match is None:
                raise ValueError("an image part must be a data:image/…;base64 URL to be sent to an anthropic provider")
            blocks.append({"type": "image", "source": {"type": "base64", "media_type": match[1], "data": match[2]}})
        elif text := _text([part]):
            blocks.append({"type": "text", "text": text})
    return blocks


def _tool_input(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = outside_json.loads(arguments or "{}")
    except ValueError:
        value = None
    # tool_use.input must be an object; arguments a model garbled are kept for it to see.
    return value if isinstance(value, dict) else {"_arguments": str(arguments)}


def to_anthropic(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, messages) in Anthropic's shape, from neutral messages."""
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def push(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in messages:
        role = message.get("role")
        if role == "system":
            system.append(_text(message.get("content")))
        elif role == "user":
            push("user", _user_blocks(message.get("content")))
        elif role == "assistant":
            text = _text(message.get("content"))
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            for call in message.get("tool_calls") or []:
                function = call["function"]
                blocks.append({"type": "tool_use", "id": call["id"], "name": function["name"],
                               "input": _tool_input(function.get("arguments"))})
            push("assistant", blocks)
        elif role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message["tool_call_id"],
                                     "content": _text(message.get("content"))}
            if message.get("is_error"):
                block["is_error"] = True
            push("user", [block])
        else:
            raise ValueError(f"unknown message role {role!r}")
    return "\n\n".join(s for s in system if s), out


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        function = tool["function"]
        entry = {"name": function["name"], "input_schema": function.get("parameters") or {"type": "object", "properties": {}}}
        if function.get("description"):
            entry["description"] = function["description"]
        out.append(entry)
    return out


def _input_tokens(usage: dict[str, Any]) -> int | None:
    """Input tokens including prompt-cache writes and reads (both are billed input)."""
    total, seen = 0, False
    for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        value = usage.get(name)
        if isinstance(value, int) and value >= 0:
            total, seen = total + value, True
    return total if seen else None


class _AnthropicStream(StreamAssembler):
    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None

    def feed(self, event: SseEvent) -> str | None:
        try:
            data = outside_json.loads(event.data)
        except ValueError:
            raise ProviderProtocolError("a streamed event is not JSON") from None
        require(isinstance(data, dict), "a streamed event is not a JSON object")
        kind = data.get("type", event.event)
        if kind == "error":
            error = data.get("error") or {}
            raise ProviderProtocolError(f"the provider sent an error mid-stream: {str(error.get('message', error))[:300]}")
        if kind == "message_start":
            usage = (data.get("message") or {}).get("usage") or {}
            self.input_tokens = _input_tokens(usage)
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            self.blocks[data.get("index", len(self.blocks))] = {**block, "parts": []}
        elif kind == "content_block_delta":
            block = self.blocks.get(data.get("index"))
            require(block is not None, "a content_block_delta for a block that was not started")
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["parts"].append(delta.get("text", ""))
                return delta.get("text") or None
            if delta.get("type") == "input_json_delta":
                block["parts"].append(delta.get("partial_json", ""))
        elif kind == "message_delta":
            output = (data.get("usage") or {}).get("output_tokens")
            if isinstance(output, int) and output >= 0:
                self.output_tokens = output
        elif kind == "message_stop":
            self.done = True
        return None

    def answer(self) -> Answer:
        text, calls = [], []
        for _, block in sorted(self.blocks.items()):
            if block.get("type") == "text":
                text.append("".join(block["parts"]))
            elif block.get("type") == "tool_use":
                arguments = "".join(block["parts"]) or json.dumps(block.get("input") or {})
                calls.append(tool_call(str(block.get("id")), str(block.get("name")), arguments))
        return Answer({"role": "assistant", "content": "".join(text), "tool_calls": calls}, self.input_tokens, self.output_tokens)


class AnthropicAdapter(Adapter):
    kind = "anthropic"

    path = "/messages"

    def headers(self, config: ProviderConfig, key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": config.anthropic_version}
        if key is not None:
            headers["x-api-key"] = key
        return headers

    def body(self, config: ProviderConfig, turn: ChatTurn) -> dict[str, Any]:
        system, converted = to_anthropic(turn.messages)
        body: dict[str, Any] = {
            "model": turn.model,
            "max_tokens": config.max_output_tokens or DEFAULT_MAX_TOKENS,
            "messages": converted,
        }
        if system:
            body["system"] = system
        if turn.tools:
            body["tools"] = _tools(turn.tools)
        if turn.stream:
            body["stream"] = True
        return body

    def answer(self, data: Any) -> Answer:
        require(isinstance(data, dict), "the response is not a JSON object")
        blocks = data.get("content")
        require(isinstance(blocks, list), "the response has no content list")
        text, calls = [], []
        for block in blocks:
            require(isinstance(block, dict), "a content block is not an object")
            if block.get("type") == "text":
                text.append(str(block.get("text", "")))
            elif block.get("type") == "tool_use":
                require(isinstance(block.get("name"), str) and bool(block["name"]), "a tool_use block has no name")
                calls.append(tool_call(str(block.get("id")), block["name"], block.get("input") or {}))
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        output = usage.get("output_tokens")
        return Answer(
            {"role": "assistant", "content": "".join(text), "tool_calls": calls},
            _input_tokens(usage),
            output if isinstance(output, int) and output >= 0 else None,
        )

    def assembler(self) -> StreamAssembler:
        return _AnthropicStream()

    def error_message(self, data: Any) -> str | None:
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            message = data["error"].get("message")
            return message if isinstance(message, str) else None
        return None
