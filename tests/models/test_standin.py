"""The demo's stand-in model, a real process driven through the real gateway."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from covenant.config import ProviderConfig
from covenant.models import ModelError
from tests.conftest import REPO_ROOT
from tests.models.helpers import Recorder, gateway, model_call

SCRIPT = REPO_ROOT / "scripts" / "standin_model.py"
SYSTEM = {"role": "system", "content": "You triage support tickets. Classify each ticket as technical or billing with "
                                       "the classify_ticket tool, fetch linked status pages when they help."}
TICKET = {"role": "user", "content": "I was charged twice for my subscription, please refund"}
TOOLS = [
    {"type": "function", "function": {"name": "web-fetch", "description": "Fetch a URL.",
                                      "parameters": {"type": "object", "properties": {"url": {"type": "string"}},
                                                     "required": ["url"]}}},
    {"type": "function", "function": {"name": "classify_ticket", "description": "Label a ticket.",
                                      "parameters": {"type": "object", "properties": {"ticket": {"type": "string"}},
                                                     "required": ["ticket"]}}},
]


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[str]:
    port_file = tmp_path / "port"
    process = subprocess.Popen([sys.executable, str(SCRIPT), "--port-file", str(port_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}/v1"
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "[stand-in model]" in stderr and "not a language model" in stderr




@pytest.mark.parametrize("streaming", [False, True])
async def test_one_tool_call_then_an_answer_from_its_result(standin: str, streaming: bool) -> None:
    recorder = Recorder()
    gw = gateway({"standin": ProviderConfig(kind="openai", base_url=standin, model="covenant-stand-in-model")}, recorder)
    tokens: list[str] = []

    async def on_token(text: str) -> None:
        tokens.append(text)

    call = model_call("standin", limit=50_000)
    kw = {"on_token": on_token} if streaming else {}
    try:
        first = await gw.chat(call, [SYSTEM, TICKET], TOOLS, **kw)
        [tool_call] = first.tool_calls
        assert tool_call["function"]["name"] == "classify_ticket", "the tool the prompt names, not web-fetch"
        assert json.loads(tool_call["function"]["arguments"]) == {"ticket": TICKET["content"]}
        result = {"role": "tool", "tool_call_id": tool_call["id"], "content": "billing"}
        second = await gw.chat(call, [SYSTEM, TICKET, first.message, result], TOOLS, **kw)
    finally:
        await gw.aclose()
    assert second.tool_calls == []
    assert second.text == "[stand-in model] classify_ticket says: billing. Next step: hand it to the billing team."
    if streaming:
        assert "".join(tokens) == second.text
    assert first.input_tokens > 0 and first.output_tokens > 0
    assert call.budget.used == sum(e["input_tokens"] + e["output_tokens"] for e in recorder.calls())
    assert [e["model"] for e in recorder.calls()] == ["covenant-stand-in-model"] * 2


async def test_it_is_deterministic_and_labelled(standin: str) -> None:
    body = {"model": "anything", "messages": [SYSTEM, TICKET], "tools": TOOLS}
    with httpx.Client() as client:
        answers = [client.post(f"{standin}/chat/completions", json=body).json() for _ in range(2)]
        plain = client.post(f"{standin}/chat/completions", json={"messages": [TICKET]}).json()
        models = client.get(f"{standin}/models").json()
        bad = client.post(f"{standin}/chat/completions", content=b"not json", headers={"content-type": "application/json"})
        # A workflow step's templated request: the tool gets the ticket, not the instruction around it.
        step = {"role": "user", "content": "Classify this support ticket: The dashboard shows a 502 error"}
        stepped = client.post(f"{standin}/chat/completions", json={"messages": [SYSTEM, step], "tools": TOOLS}).json()
    assert answers[0] == answers[1]
    assert answers[0]["model"] == "covenant-stand-in-model"
    assert plain["choices"][0]["message"]["content"].startswith("[stand-in model] (rule-based, not a language model)")
    assert models["data"][0]["id"] == "covenant-stand-in-model"
    assert bad.status_code == 400
    [call] = stepped["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"ticket": "The dashboard shows a 502 error"}


async def test_a_tool_error_is_answered_not_retried(standin: str) -> None:
    gw = gateway({"standin": ProviderConfig(kind="openai", base_url=standin)}, Recorder())
    call = model_call("standin")
    try:
        first = await gw.chat(call, [SYSTEM, TICKET], TOOLS)
        failed = {"role": "tool", "tool_call_id": first.tool_calls[0]["id"], "is_error": True,
                  "content": json.dumps({"error": {"code": "timeout", "message": "tool took too long"}})}
        second = await gw.chat(call, [SYSTEM, TICKET, first.message, failed], TOOLS)
        tiny = model_call("standin", limit=10)
        await gw.chat(tiny, [SYSTEM, TICKET], TOOLS)
        with pytest.raises(ModelError, match="token_budget_exceeded"):
            await gw.chat(tiny, [SYSTEM, TICKET], TOOLS)
    finally:
        await gw.aclose()
    assert second.text == "[stand-in model] classify_ticket failed (tool took too long), so I cannot finish this one."


def _call(tools: list[dict], text: str) -> tuple[str, dict] | None:
    """The stand-in's tool call (name, arguments) for one user message, or None when it answers directly."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import standin_model
    finally:
        sys.path.remove(str(SCRIPT.parent))
    message = standin_model.reply({"messages": [{"role": "user", "content": text}], "tools": tools})
    calls = message.get("tool_calls")
    if not calls:
        assert message["content"].startswith("[stand-in model]")
        return None
    return calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"])


def _tool(name: str, properties: dict | None = None, required: tuple[str, ...] = ()) -> dict:
    parameters = {"type": "object", "additionalProperties": False}
    if properties is not None:
        parameters |= {"properties": properties, "required": list(required)}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def test_arguments_follow_each_schema() -> None:
    """No-argument tools get {}; enums, URLs, lengths and numbers are filled sensibly."""
    assert _call([_tool("system-time")], "what system time is it?") == ("system-time", {})
    assert _call([_tool("system-time", {})], "what system time is it?") == ("system-time", {})
    priority = _tool("set_priority", {"level": {"type": "string", "enum": ["low", "normal", "high"]},
                                      "count": {"type": "integer", "minimum": 3}}, ("level", "count"))
    assert _call([priority], "set priority: make it HIGH please") == ("set_priority", {"level": "high", "count": 3})
    assert _call([priority], "set the priority") == ("set_priority", {"level": "low", "count": 3})
    fetch = _tool("web-fetch", {"url": {"type": "string"}}, ("url",))
    assert _call([fetch], "fetch https://status.example.com/now, then say") == ("web-fetch", {"url": "https://status.example.com/now"})
    short = _tool("summarise", {"text": {"type": "string", "maxLength": 5}}, ("text",))
    assert _call([short], "summarise this: abcdefgh") == ("summarise", {"text": "abcde"})


def test_a_tool_whose_required_url_the_message_lacks_is_not_called() -> None:
    fetch = _tool("web-fetch", {"url": {"type": "string", "format": "uri"}}, ("url",))
    classify = _tool("classify_ticket", {"ticket": {"type": "string"}}, ("ticket",))
    assert _call([fetch], "fetch the status page") is None  # no URL: answers instead of fetching nonsense
    assert _call([fetch, classify], "fetch and classify this ticket: it is broken") == ("classify_ticket", {"ticket": "it is broken"})
