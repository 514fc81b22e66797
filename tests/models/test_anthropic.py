"""The Anthropic adapter against the fake server: conversion both ways, tool_use/tool_result, streaming."""

from __future__ import annotations

import json

from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.models.helpers import KEY, WEATHER_TOOL, Recorder, gateway, model_call, provider

SYSTEM = {"role": "system", "content": "You triage tickets."}
USER = {"role": "user", "content": "I was charged twice"}


async def test_tool_call_round_trip_with_an_error_result(fake_model: FakeModelServer) -> None:
    fake_model.script(
        Reply.tools(ToolCall("classify_ticket", {"text": "charged twice"}, id="toolu_1"),
                    ToolCall("classify_ticket", {"text": "again"}, id="toolu_2"), text="Let me check.", usage=(40, 12)),
        Reply(text="A billing ticket.", usage=(70, 5)),
    )
    recorder = Recorder()
    gw = gateway({"anthropic": provider(fake_model, "anthropic", api_key_env="ANTHROPIC_API_KEY")}, recorder,
                 {"ANTHROPIC_API_KEY": KEY})
    call = model_call("anthropic")
    try:
        first = await gw.chat(call, [SYSTEM, USER], [WEATHER_TOOL])
        assert first.text == "Let me check."
        assert [(c["id"], json.loads(c["function"]["arguments"])) for c in first.tool_calls] == [
            ("toolu_1", {"text": "charged twice"}), ("toolu_2", {"text": "again"})]
        results = [
            {"role": "tool", "tool_call_id": "toolu_1", "content": "billing"},
            {"role": "tool", "tool_call_id": "toolu_2", "is_error": True,
             "content": json.dumps({"error": {"code": "timeout", "message": "tool took too long"}})},
        ]
        second = await gw.chat(call, [SYSTEM, USER, first.message, *results], [WEATHER_TOOL])
    finally:
        await gw.aclose()
    assert second.text == "A billing ticket." and second.tool_calls == []
    assert call.budget.used == 40 + 12 + 70 + 5

    request = fake_model.requests[0]
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert request.body["system"] == "You triage tickets."
    assert request.body["max_tokens"] == 4096
    assert request.body["tools"] == [{"name": "classify_ticket", "description": "Label a ticket technical or billing.",
                                      "input_schema": WEATHER_TOOL["function"]["parameters"]}]
    assert request.messages == [{"role": "user", "content": [{"type": "text", "text": "I was charged twice"}]}]
    sent = fake_model.requests[1].messages
    assert sent[1] == {"role": "assistant", "content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "classify_ticket", "input": {"text": "charged twice"}},
        {"type": "tool_use", "id": "toolu_2", "name": "classify_ticket", "input": {"text": "again"}},
    ]}
    # Both results in one user turn; the failed one flagged is_error.
    assert sent[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "billing"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
         "content": '{"error": {"code": "timeout", "message": "tool took too long"}}'},
    ]}
    assert len(sent) == 3


async def test_streaming_text_and_tool_calls(fake_model: FakeModelServer) -> None:
    fake_model.script(
        Reply.tools(ToolCall("classify_ticket", {"text": "an argument long enough to arrive in pieces"}),
                    text="Classifying the ticket now.", usage=(33, 21)),
    )
    gw = gateway({"anthropic": provider(fake_model, "anthropic")}, Recorder())
    tokens: list[str] = []

    async def on_token(text: str) -> None:
        tokens.append(text)

    try:
        result = await gw.chat(model_call("anthropic"), [SYSTEM, USER], [WEATHER_TOOL], on_token=on_token)
    finally:
        await gw.aclose()
    assert len(tokens) > 2 and "".join(tokens) == result.text == "Classifying the ticket now."
    assert [json.loads(c["function"]["arguments"]) for c in result.tool_calls] == [
        {"text": "an argument long enough to arrive in pieces"}]
    assert (result.input_tokens, result.output_tokens) == (33, 21)
    assert fake_model.requests[0].body["stream"] is True
