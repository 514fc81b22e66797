"""The loop on its own, over a scripted backend (the seam the replica's gateway client fills)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from covenant.rune.history import window
from covenant.rune.loop import CALLS_AT_ONCE, LoopFailed, LoopSpec, run_loop

TOOLS = [{"type": "function", "function": {"name": "system-time", "parameters": {"type": "object"}}}]


def call(name: str, args: Any = "{}", cid: str = "c1") -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


class Scripted:
    """Answers model turns from a list; runs tools by name, recording concurrency."""

    def __init__(self, turns: list[dict[str, Any]], tool_delay: float = 0.0) -> None:
        self.turns = list(turns)
        self.seen: list[list[dict[str, Any]]] = []
        self.tool_calls: list[tuple[str, Any]] = []
        self.running = 0
        self.most_running = 0
        self.tool_delay = tool_delay

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], on_token: Any) -> dict[str, Any]:
        self.seen.append(messages)
        message = self.turns.pop(0)
        if on_token is not None and message.get("content"):
            for word in message["content"].split(" "):
                await on_token(word + " ")
        return {"message": message, "input_tokens": 10, "output_tokens": 5, "provider": "p", "model": "m"}

    async def tool(self, call_id: str, name: str, arguments: Any) -> dict[str, Any]:
        self.tool_calls.append((name, arguments))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        await trio.sleep(self.tool_delay)
        self.running -= 1
        if name == "system-time":
            return {"ok": True, "content": {"utc": "2026-01-01T00:00:00Z"}}
        return {"ok": False, "error_code": "unknown_tool", "error_message": f"no tool named {name!r}"}


async def test_tool_round_trip_and_answer() -> None:
    backend = Scripted([{"role": "assistant", "content": "", "tool_calls": [call("system-time")]},
                        {"role": "assistant", "content": "It is 2026."}])
    result = await run_loop(LoopSpec("be brief", TOOLS, max_steps=5), backend, [], "what time is it?")
    assert result.text == "It is 2026."
    assert result.usage == {"input_tokens": 20, "output_tokens": 10, "model_calls": 2, "tool_calls": 1, "steps": 2}
    second = backend.seen[1]
    assert second[0] == {"role": "system", "content": "be brief"}
    assert second[2]["content"] == "" and second[2]["tool_calls"][0]["id"] == "c1"  # "" never null
    assert json.loads(second[3]["content"]) == {"utc": "2026-01-01T00:00:00Z"}
    assert [m["role"] for m in result.messages] == ["user", "assistant", "tool", "assistant"]


async def test_unknown_tool_and_bad_arguments_go_back_as_error_results() -> None:
    backend = Scripted([{"role": "assistant", "content": "", "tool_calls": [call("nope", cid="a"), call("system-time", "{bad", "b")]},
                        {"role": "assistant", "content": "done"}])
    result = await run_loop(LoopSpec("s", TOOLS, max_steps=3), backend, [], "x")
    assert result.text == "done"
    tool_messages = [m for m in backend.seen[1] if m["role"] == "tool"]
    assert json.loads(tool_messages[0]["content"])["error"]["code"] == "unknown_tool"
    assert tool_messages[0]["is_error"] is True
    assert ("system-time", "{bad") in backend.tool_calls  # the raw text: the tool host judges it


async def test_a_turn_of_many_calls_runs_them_all_a_few_at_a_time() -> None:
    calls = [call("system-time", cid=f"c{n}") for n in range(100)]
    backend = Scripted([{"role": "assistant", "content": "", "tool_calls": calls},
                        {"role": "assistant", "content": "ok"}], tool_delay=0.01)
    result = await run_loop(LoopSpec("s", TOOLS, max_steps=3), backend, [], "x")
    assert result.usage["tool_calls"] == 100 and len(backend.tool_calls) == 100
    assert [m["tool_call_id"] for m in backend.seen[1] if m["role"] == "tool"] == [f"c{n}" for n in range(100)]
    assert backend.most_running == CALLS_AT_ONCE


async def test_calls_of_one_turn_run_concurrently() -> None:
    calls = [call("system-time", cid=f"c{n}") for n in range(4)]
    backend = Scripted([{"role": "assistant", "content": "", "tool_calls": calls},
                        {"role": "assistant", "content": "ok"}], tool_delay=0.2)
    await run_loop(LoopSpec("s", TOOLS, max_steps=3), backend, [], "x")
    assert backend.most_running == 4
    ids = [m["tool_call_id"] for m in backend.seen[1] if m["role"] == "tool"]
    assert ids == ["c0", "c1", "c2", "c3"]  # results in call order


async def test_max_steps_cuts_off_a_model_that_never_stops() -> None:
    backend = Scripted([{"role": "assistant", "content": "", "tool_calls": [call("system-time")]}] * 3)
    with pytest.raises(LoopFailed) as failed:
        await run_loop(LoopSpec("s", TOOLS, max_steps=3), backend, [], "x")
    assert failed.value.code == "max_steps_exceeded"
    assert failed.value.usage["model_calls"] == 3
    assert not backend.turns


async def test_strict_wraps_tool_results_as_untrusted() -> None:
    backend = Scripted([{"role": "assistant", "content": "", "tool_calls": [call("system-time")]},
                        {"role": "assistant", "content": "ok"}])
    await run_loop(LoopSpec("s", TOOLS, max_steps=3, safety_policy="strict"), backend, [], "x")
    assert "untrusted" in backend.seen[0][0]["content"]
    tool = next(m for m in backend.seen[1] if m["role"] == "tool")
    assert tool["content"].startswith('<untrusted-data tool="system-time">')


async def test_events_and_steps() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    steps: list[int] = []

    async def emit(event: str, data: dict[str, Any]) -> None:
        events.append((event, data))

    async def on_step(messages: list[dict[str, Any]]) -> None:
        steps.append(len(messages))

    backend = Scripted([{"role": "assistant", "content": "", "tool_calls": [call("system-time")]},
                        {"role": "assistant", "content": "a b"}])
    await run_loop(LoopSpec("s", TOOLS, max_steps=3), backend, [], "x", emit=emit, on_step=on_step)
    assert [e for e, _ in events] == ["tool_start", "tool_done", "token", "token"]
    assert "".join(d["text"] for e, d in events if e == "token") == "a b "
    assert steps == [3, 1]


def test_memory_profiles() -> None:
    turns = [[{"role": "user", "content": "x" * 400}, {"role": "assistant", "content": f"t{n}"}] for n in range(5)]
    assert window(turns, profile="minimal", standard_turns=20, token_budget=10**6) == []
    assert [m["content"] for m in window(turns, profile="standard", standard_turns=2, token_budget=10**6)][1::2] == ["t3", "t4"]
    assert len(window(turns, profile="extended", standard_turns=0, token_budget=10**6)) == 10
    kept = window(turns, profile="extended", standard_turns=0, token_budget=250)
    assert [m["content"] for m in kept][1::2] == ["t4"]  # oldest dropped to fit half the budget


class Asking(Scripted):
    """``ask-user`` answers as the tool host does (``asks`` beside the content); ``echo-asks`` is a tool whose own
    content merely holds an ``asks`` key, which must not end the turn."""

    async def tool(self, call_id: str, name: str, arguments: Any) -> dict[str, Any]:
        if name == "ask-user":
            return {"ok": True, "content": {"asked": True}, "asks": json.loads(arguments)["question"]}
        if name == "echo-asks":
            return {"ok": True, "content": {"asks": "not a question"}}
        return await super().tool(call_id, name, arguments)


async def test_ask_user_ends_the_turn_after_all_its_calls_with_the_question_as_the_answer() -> None:
    asked = call("ask-user", json.dumps({"question": "Which city?"}), "q")
    backend = Asking([{"role": "assistant", "content": "", "tool_calls": [call("system-time", cid="t"), asked]},
                      {"role": "assistant", "content": "never reached"}])
    result = await run_loop(LoopSpec("s", TOOLS, max_steps=5), backend, [], "book a flight")
    assert result.input_required and result.text == "Which city?"
    assert [m["role"] for m in result.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert result.messages[-1] == {"role": "assistant", "content": "Which city?"}
    assert [name for name, _ in backend.tool_calls] == ["system-time"] and len(backend.seen) == 1  # no second turn

    plain = Asking([{"role": "assistant", "content": "", "tool_calls": [call("echo-asks")]},
                    {"role": "assistant", "content": "Which city?"}])
    answered = await run_loop(LoopSpec("s", TOOLS, max_steps=5), plain, [], "x")
    assert not answered.input_required and answered.text == "Which city?" and len(plain.seen) == 2
