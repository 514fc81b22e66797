"""OpenAI chat completions (also vLLM, Ollama, llama.cpp's server, LM Studio): ``POST {base_url}/chat/completions``."""

from __future__ import annotations

from typing import Any

from covenant import outside_json
from covenant.config import ProviderConfig
from covenant.models.adapter import Adapter, ChatTurn, StreamAssembler, require, tool_call
from covenant.sse import SseEvent
from covenant.models.types import Answer, ProviderProtocolError

__all__ = ["OpenAIAdapter"]


def outgoing_message(message: dict[str, Any]) -> dict[str, Any]:
    """A neutral message as OpenAI-compatible servers accept it.

    ``content: null`` becomes ``""`` (llama.cpp rejects null), an empty ``tool_calls`` list is
    dropped (OpenAI rejects ``[]``) and the neutral ``is_error`` flag of tool results is removed
    (the error is already in the content).
    """
    out = dict(message)
    if out.get("content") is None:
        out["content"] = ""
    if "tool_calls" in out and not out["tool_calls"]:
        del out["tool_calls"]
    out.pop("is_error", None)
    return out


def _usage(data: dict[str, Any]) -> tuple[int | None, int | None]:
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) and prompt >= 0 else None,
        completion if isinstance(completion, int) and completion >= 0 else None,
    )


class _OpenAIStream(StreamAssembler):
    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None

    def feed(self, event: SseEvent) -> str | None:
        if event.data.strip() == "[DONE]":
            self.done = True
            return None
        try:
            chunk = outside_json.loads(event.data)
        except ValueError:
            raise ProviderProtocolError("a streamed chunk is not JSON") from None
        require(isinstance(chunk, dict), "a streamed chunk is not a JSON object")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise ProviderProtocolError(f"the provider sent an error mid-stream: {str(message)[:300]}")
        prompt, completion = _usage(chunk)
        if prompt is not None:
            self.input_tokens, self.output_tokens = prompt, completion
        added = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                self.text.append(piece)
                added.append(piece)
            for part in delta.get("tool_calls") or []:
                index = part.get("index", len(self.calls))
                call = self.calls.setdefault(index, {"id": None, "name": "", "arguments": []})
                if part.get("id"):
                    call["id"] = part["id"]
                function = part.get("function") or {}
                if function.get("name"):
                    call["name"] += function["name"]
                if function.get("arguments"):
                    call["arguments"].append(function["arguments"])
        return "".join(added) or None

    def answer(self) -> Answer:
        calls = [
            tool_call(call["id"] or f"call_{index}", call["name"], "".join(call["arguments"]) or "{}")
            for index, call in sorted(self.calls.items())
        ]
        for call in calls:
            require(bool(call["function"]["name"]), "a streamed tool call has no function name")
        message = {"role": "assistant", "content": "".join(self.text), "tool_calls": calls}
        return Answer(message, self.input_tokens, self.output_tokens)


class OpenAIAdapter(Adapter):
    kind = "openai"

    path = "/chat/completions"

    def headers(self, config: ProviderConfig, key: str | None) -> dict[str, str]:
        return {} if key is None else {"authorization": f"Bearer {key}"}

    def body(self, config: ProviderConfig, turn: ChatTurn) -> dict[str, Any]:
        body: dict[str, Any] = {"model": turn.model, "messages": [outgoing_message(m) for m in turn.messages]}
        if turn.tools:
            body["tools"] = turn.tools
        if config.max_output_tokens is not None:
            body["max_tokens"] = config.max_output_tokens
        if turn.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def answer(self, data: Any) -> Answer:
        require(isinstance(data, dict), "the response is not a JSON object")
        choices = data.get("choices")
        require(isinstance(choices, list) and bool(choices), "the response has no choices")
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        require(isinstance(message, dict), "the response's first choice has no message")
        content = message.get("content")
        require(content is None or isinstance(content, str), "the message content is not text")
        calls = []
        for index, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") if isinstance(call, dict) else None
            require(isinstance(function, dict) and isinstance(function.get("name"), str) and bool(function["name"]),
                    "a tool call has no function name")
            calls.append(tool_call(str(call.get("id") or f"call_{index}"), function["name"], function.get("arguments")))
        prompt, completion = _usage(data)
        return Answer({"role": "assistant", "content": content or "", "tool_calls": calls}, prompt, completion)

    def assembler(self) -> StreamAssembler:
        return _OpenAIStream()

    def error_message(self, data: Any) -> str | None:
        if isinstance(data, dict):
            error = data.get("error")
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                return error["message"]
            if isinstance(error, str):
                return error
        return None
