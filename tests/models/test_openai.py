"""The OpenAI adapter against the fake server: round trips, tool calls, streaming, usage."""

from __future__ import annotations

import json

from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.models.helpers import KEY, WEATHER_TOOL, Recorder, gateway, model_call, provider

SYSTEM = {"role": "system", "content": "You triage tickets."}
USER = {"role": "user", "content": "I was charged twice"}


async def test_tool_call_round_trip(fake_model: FakeModelServer) -> None:
    fake_model.script(
        Reply.tools(ToolCall("classify_ticket", {"text": "I was charged twice"}, id="call_x"), usage=(30, 7)),
        Reply(text="Billing: we will refund the second charge.", usage=(50, 9)),
    )
    recorder = Recorder()
    gw = gateway({"openai": provider(fake_model, api_key_env="OPENAI_API_KEY")}, recorder, {"OPENAI_API_KEY": KEY})
    call = model_call("openai")
    try:
        first = await gw.chat(call, [SYSTEM, USER], [WEATHER_TOOL])
        assert first.message == {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_x", "type": "function",
                            "function": {"name": "classify_ticket", "arguments": '{"text": "I was charged twice"}'}}],
        }
        assert (first.provider, first.model, first.input_tokens, first.output_tokens) == ("openai", "model-a", 30, 7)
        tool_result = {"role": "tool", "tool_call_id": "call_x", "content": "billing"}
        second = await gw.chat(call, [SYSTEM, USER, first.message, tool_result], [WEATHER_TOOL])
    finally:
        await gw.aclose()
    assert second.text == "Billing: we will refund the second charge."
    assert second.tool_calls == []
    assert call.budget.used == 30 + 7 + 50 + 9

    sent = fake_model.requests
    assert [r.path for r in sent] == ["/v1/chat/completions"] * 2
    assert sent[0].headers["authorization"] == f"Bearer {KEY}"
    assert sent[0].body["model"] == "model-a"
    assert sent[0].body["tools"] == [WEATHER_TOOL]
    assert "stream" not in sent[0].body
    # The assistant tool-call turn goes back with content "" (never null) and the tool result after it.
    assert sent[1].messages[2] == {**first.message, "content": ""}
    assert sent[1].messages[3] == tool_result


async def test_parallel_tool_calls_in_one_turn(fake_model: FakeModelServer) -> None:
    fake_model.script(Reply.tools(ToolCall("classify_ticket", {"text": "a"}), ToolCall("web-fetch", {"url": "https://x.test"}),
                                  text="Checking both."))
    recorder = Recorder()
    gw = gateway({"local": provider(fake_model)}, recorder)
    try:
        result = await gw.chat(model_call("local"), [USER], [WEATHER_TOOL])
    finally:
        await gw.aclose()
    assert result.text == "Checking both."
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in result.tool_calls] == [
        ("call_0", "classify_ticket", {"text": "a"}),
        ("call_1", "web-fetch", {"url": "https://x.test"}),
    ]
    # No key configured: no auth header at all.
    assert "authorization" not in fake_model.requests[0].headers


async def test_streaming_text_and_tool_calls(fake_model: FakeModelServer) -> None:
    fake_model.script(
        Reply(text="The ticket is about billing, refund due.", usage=(12, 8)),
        Reply.tools(ToolCall("classify_ticket", {"text": "a long ticket body to split into pieces"}),
                    ToolCall("classify_ticket", {"text": "second"}), text="Looking.", usage=(20, 11)),
    )
    recorder = Recorder()
    gw = gateway({"local": provider(fake_model)}, recorder)
    tokens: list[str] = []

    async def on_token(text: str) -> None:
        tokens.append(text)

    call = model_call("local")
    try:
        plain = await gw.chat(call, [USER], [], on_token=on_token)
        assert len(tokens) > 3, "the text arrives in several deltas"
        assert "".join(tokens) == plain.text == "The ticket is about billing, refund due."
        tokens.clear()
        with_tools = await gw.chat(call, [USER], [WEATHER_TOOL], on_token=on_token)
    finally:
        await gw.aclose()
    assert "".join(tokens) == "Looking."
    assert [json.loads(c["function"]["arguments"]) for c in with_tools.tool_calls] == [
        {"text": "a long ticket body to split into pieces"}, {"text": "second"}]
    assert (plain.input_tokens, plain.output_tokens, with_tools.input_tokens, with_tools.output_tokens) == (12, 8, 20, 11)
    assert call.budget.used == 12 + 8 + 20 + 11
    body = fake_model.requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert [e["outcome"] for e in recorder.calls()] == ["ok", "ok"]


async def test_missing_usage_is_estimated_not_free(fake_model: FakeModelServer) -> None:
    fake_model.script(Reply(text="x" * 400, no_usage=True))
    gw = gateway({"local": provider(fake_model)}, Recorder())
    call = model_call("local")
    try:
        result = await gw.chat(call, [USER], [])
    finally:
        await gw.aclose()
    assert result.output_tokens >= 100 and result.input_tokens >= 1
    assert call.budget.used == result.input_tokens + result.output_tokens
