"""Gateway behaviour: fallback, retries, timeouts, budgets, plans, audit events and key secrecy."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from covenant.config import ProviderConfig
from covenant.models import ModelError, TokenBudget
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.models.helpers import KEY, Recorder, gateway, model_call, provider

USER = {"role": "user", "content": "hello"}
FIELDS = {"intent", "agent", "provider", "model", "attempt", "http_status", "input_tokens", "output_tokens", "outcome", "error_code", "ms"}


def summary(recorder: Recorder) -> list[tuple[str, int, int | None, str]]:
    return [(e["provider"], e["attempt"], e["http_status"], e["outcome"]) for e in recorder.calls()]


async def test_500_falls_back_to_the_next_provider_with_one_event_per_attempt(fake_model_factory) -> None:
    first, second = fake_model_factory(), fake_model_factory()
    first.script(Reply.error(500))
    second.script(Reply(text="from b", usage=(5, 3)))
    recorder = Recorder()
    gw = gateway({"a": provider(first), "b": provider(second)}, recorder)
    call = model_call("a", "b")
    try:
        result = await gw.chat(call, [USER], [])
    finally:
        await gw.aclose()
    assert (result.text, result.provider) == ("from b", "b")
    assert summary(recorder) == [("a", 1, 500, "error"), ("b", 2, 200, "ok")]
    for event in recorder.calls():
        assert set(event) == FIELDS
        assert (event["intent"], event["agent"], event["model"]) == ("intent-1", "triage@local", "model-a")
        assert isinstance(event["ms"], int) and event["ms"] >= 0
    assert [(e["input_tokens"], e["output_tokens"]) for e in recorder.calls()] == [(0, 0), (5, 3)]
    assert recorder.observed == [("triage@local", "a", "http_error", 0, 0, 1), ("triage@local", "b", "ok", 5, 3, 2)]
    assert call.budget.used == 8


async def test_fail_policy_surfaces_the_first_error(fake_model_factory) -> None:
    first, second = fake_model_factory(), fake_model_factory()
    first.script(Reply.error(503, message="overloaded"))
    recorder = Recorder()
    gw = gateway({"a": provider(first), "b": provider(second)}, recorder)
    try:
        with pytest.raises(ModelError) as caught:
            await gw.chat(model_call("a", "b", fallback="fail"), [USER], [])
    finally:
        await gw.aclose()
    assert caught.value.code == "provider_error"
    assert "a (model-a): HTTP 503: overloaded" in caught.value.message
    assert second.requests == []
    assert summary(recorder) == [("a", 1, 503, "error")]


async def test_429_with_a_short_retry_after_is_retried_once(fake_model: FakeModelServer) -> None:
    fake_model.script(Reply.error(429, retry_after="0.2"), Reply(text="after the wait"))
    recorder = Recorder()
    gw = gateway({"a": provider(fake_model)}, recorder)
    try:
        result = await gw.chat(model_call("a"), [USER], [])
    finally:
        await gw.aclose()
    assert result.text == "after the wait"
    assert summary(recorder) == [("a", 1, 429, "error"), ("a", 2, 200, "ok")]
    assert [(o[2], o[5]) for o in recorder.observed] == [("rate_limited", 1), ("ok", 2)]  # metrics: one retry


async def test_429_twice_moves_on_and_a_long_retry_after_is_not_waited_for(fake_model_factory) -> None:
    first, second = fake_model_factory(), fake_model_factory()
    first.script(Reply.error(429, retry_after="0"), Reply.error(429, retry_after="0"))
    second.script(Reply.error(429, retry_after="3600"), Reply(text="never reached"))
    recorder = Recorder()
    gw = gateway({"a": provider(first), "b": provider(second)}, recorder)
    try:
        with pytest.raises(ModelError) as caught:
            await gw.chat(model_call("a", "b"), [USER], [])
    finally:
        await gw.aclose()
    assert caught.value.code == "provider_error"
    assert summary(recorder) == [("a", 1, 429, "error"), ("a", 2, 429, "error"), ("b", 3, 429, "error")]
    assert second.pending == 1
    assert caught.value.message.count("HTTP 429") == 3


async def test_a_slow_provider_times_out_and_the_next_answers(fake_model_factory) -> None:
    slow, fast = fake_model_factory(), fake_model_factory()
    slow.script(Reply(text="too late", delay_s=60))
    fast.script(Reply(text="in time"))
    recorder = Recorder()
    gw = gateway({"slow": provider(slow, timeout_s=0.5), "fast": provider(fast)}, recorder)
    try:
        result = await gw.chat(model_call("slow", "fast"), [USER], [])
    finally:
        await gw.aclose()
    assert result.text == "in time"
    assert summary(recorder) == [("slow", 1, None, "error"), ("fast", 2, 200, "ok")]
    assert [o[2] for o in recorder.observed] == ["timeout", "ok"]
    assert recorder.calls()[0]["ms"] >= 500


async def test_connection_refused_and_hang_up_fall_back(fake_model_factory) -> None:
    with socket.socket() as probe:  # a port with nobody listening
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    dead = ProviderConfig(kind="openai", base_url=f"http://127.0.0.1:{dead_port}/v1")
    rude, good = fake_model_factory(), fake_model_factory()
    rude.script(Reply.hang_up())
    good.script(Reply(text="ok"))
    recorder = Recorder()
    gw = gateway({"dead": dead, "rude": provider(rude), "good": provider(good)}, recorder)
    try:
        result = await gw.chat(model_call("dead", "rude", "good"), [USER], [])
    finally:
        await gw.aclose()
    assert result.provider == "good"
    assert summary(recorder) == [("dead", 1, None, "error"), ("rude", 2, None, "error"), ("good", 3, 200, "ok")]
    assert [o[2] for o in recorder.observed] == ["unreachable", "unreachable", "ok"]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_an_answer_nested_past_the_recursion_limit_is_a_provider_error(fake_model: FakeModelServer, kind: str) -> None:
    fake_model.script(Reply(raw_body=b'{"a":' * 20_000 + b"1" + b"}" * 20_000))
    recorder = Recorder()
    gw = gateway({"a": provider(fake_model, kind=kind)}, recorder)
    try:
        with pytest.raises(ModelError) as caught:
            await gw.chat(model_call("a"), [USER], [])
    finally:
        await gw.aclose()
    assert caught.value.code == "provider_error"
    assert "does not follow the" in caught.value.message and "deeper than 64 levels" in caught.value.message
    assert [o[2] for o in recorder.observed] == ["bad_answer"]


async def test_a_client_error_is_not_retried_elsewhere(fake_model_factory) -> None:
    first, second = fake_model_factory(), fake_model_factory()
    first.script(Reply.error(400, message="tools[0].function.name is invalid"))
    gw = gateway({"a": provider(first), "b": provider(second)}, Recorder())
    try:
        with pytest.raises(ModelError) as caught:
            await gw.chat(model_call("a", "b"), [USER], [])
    finally:
        await gw.aclose()
    assert caught.value.code == "provider_error"
    assert "HTTP 400: tools[0].function.name is invalid" in caught.value.message
    assert second.requests == []


async def test_a_stream_cut_after_text_was_shown_is_not_replayed_elsewhere(fake_model_factory) -> None:
    first, second = fake_model_factory(), fake_model_factory()
    first.script(Reply(text="one two three four five", cut_after_events=3))
    tokens: list[str] = []

    async def on_token(text: str) -> None:
        tokens.append(text)

    gw = gateway({"a": provider(first), "b": provider(second)}, Recorder())
    try:
        with pytest.raises(ModelError) as caught:
            await gw.chat(model_call("a", "b"), [USER], [], on_token=on_token)
    finally:
        await gw.aclose()
    assert caught.value.code == "provider_error" and "the connection closed before the answer was complete" in caught.value.message
    assert tokens == ["one", " two"]
    assert second.requests == []


async def test_a_stream_cut_before_any_text_falls_back(fake_model_factory) -> None:
    first, second = fake_model_factory(), fake_model_factory()
    first.script(Reply(text="never shown", cut_after_events=1))
    second.script(Reply(text="whole answer"))
    tokens: list[str] = []

    async def on_token(text: str) -> None:
        tokens.append(text)

    gw = gateway({"a": provider(first, "anthropic"), "b": provider(second)}, Recorder())
    try:
        result = await gw.chat(model_call("a", "b"), [USER], [], on_token=on_token)
    finally:
        await gw.aclose()
    assert result.provider == "b" and "".join(tokens) == "whole answer"


async def test_the_budget_answer_that_crosses_it_is_returned_and_the_next_call_refused(fake_model: FakeModelServer) -> None:
    fake_model.script(Reply(text="first", usage=(60, 10)), Reply(text="second", usage=(25, 20)))
    recorder = Recorder()
    gw = gateway({"a": provider(fake_model)}, recorder)
    budget = TokenBudget(100)
    call = model_call("a", budget=budget)
    try:
        assert (await gw.chat(call, [USER], [])).text == "first"
        assert budget.used == 70
        assert (await gw.chat(call, [USER], [])).text == "second"  # 70 < 100: allowed, ends at 115
        assert budget.used == 115
        with pytest.raises(ModelError) as caught:
            await gw.chat(call, [USER], [])
    finally:
        await gw.aclose()
    assert caught.value.code == "token_budget_exceeded"
    assert "115 of 100" in caught.value.message
    assert len(fake_model.requests) == 2, "no request is made once the budget is spent"
    assert len(recorder.calls()) == 2


async def test_a_budget_exactly_spent_refuses_and_is_shared_by_two_calls(fake_model: FakeModelServer) -> None:
    fake_model.script(Reply(text="a", usage=(30, 20)))
    gw = gateway({"a": provider(fake_model)}, Recorder())
    budget = TokenBudget(50)
    try:
        await gw.chat(model_call("a", budget=budget), [USER], [])
        with pytest.raises(ModelError, match="token_budget_exceeded"):
            await gw.chat(model_call("a", budget=budget, alias="fast"), [USER], [])
    finally:
        await gw.aclose()
    assert budget.used == 50 and len(fake_model.requests) == 1


async def test_alias_mapping_sends_the_mapped_model_id(fake_model: FakeModelServer) -> None:
    fake_model.script(Reply(text="x"), Reply(text="y"))
    recorder = Recorder()
    gw = gateway({"a": provider(fake_model)}, recorder)
    try:
        await gw.chat(model_call("a", alias="fast"), [USER], [])
        await gw.chat(model_call("a"), [USER], [])
        with pytest.raises(ModelError) as caught:
            await gw.chat(model_call("a", alias="huge"), [USER], [])
    finally:
        await gw.aclose()
    assert [r.body["model"] for r in fake_model.requests] == ["model-b", "model-a"]
    assert [e["model"] for e in recorder.calls()] == ["model-b", "model-a"]
    assert caught.value.code == "provider_unavailable"
    assert "'huge' is not a key of models.model_mapping (known: default, fast)" in caught.value.message


async def test_no_configured_provider_is_unavailable_and_names_the_table_to_add(fake_model: FakeModelServer) -> None:
    recorder = Recorder()
    gw = gateway({"openai": provider(fake_model, api_key_env="OPENAI_API_KEY")}, recorder, {})
    call = model_call("anthropic", "openai")
    plan = gw.plan(call.models)
    assert plan.attempts == ()
    assert [(s.provider, s.reason) for s in plan.skipped] == [
        ("anthropic", "no [providers.anthropic] table in covenant.toml"),
        ("openai", "the daemon's environment variable OPENAI_API_KEY (api_key_env) is not set"),
    ]
    with pytest.raises(ModelError) as caught:
        await gw.chat(call, [USER], [])
    await gw.aclose()
    assert caught.value.code == "provider_unavailable"
    assert "[providers.anthropic]" in caught.value.message and "docs/providers.md" in caught.value.message
    assert fake_model.requests == [] and recorder.events == []


async def test_a_skipped_provider_is_passed_over_and_reported(fake_model: FakeModelServer) -> None:
    fake_model.script(Reply(text="local answer"))
    gw = gateway({"local": provider(fake_model)}, Recorder())
    call = model_call("anthropic", "local")
    plan = gw.plan(call.models).to_json()
    assert plan["providers"] == [{"provider": "local", "kind": "openai", "base_url": fake_model.base_url, "model": "model-a"}]
    assert plan["skipped"] == [{"provider": "anthropic", "reason": "no [providers.anthropic] table in covenant.toml"}]
    try:
        assert (await gw.chat(call, [USER], [])).provider == "local"
    finally:
        await gw.aclose()


async def test_the_key_is_read_at_call_time(fake_model: FakeModelServer) -> None:
    fake_model.script(Reply(text="x"))
    environ: dict[str, str] = {}
    gw = gateway({"a": provider(fake_model, api_key_env="A_KEY")}, Recorder(), environ)
    try:
        with pytest.raises(ModelError, match="provider_unavailable"):
            await gw.chat(model_call("a"), [USER], [])
        environ["A_KEY"] = "rotated-key-1"
        await gw.chat(model_call("a"), [USER], [])
    finally:
        await gw.aclose()
    assert fake_model.requests[0].headers["authorization"] == "Bearer rotated-key-1"


async def test_the_key_never_leaves_through_errors_audit_or_logs(fake_model_factory, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    echo, anthropic = fake_model_factory(), fake_model_factory()
    # A hostile or careless provider echoes the key back in its error message.
    echo.script(Reply.error(401, message=f"invalid api key {KEY}"), Reply.error(500, message=f"boom {KEY}"))
    anthropic.script(Reply.error(502, message=f"bad gateway for {KEY}"))
    recorder = Recorder()
    environ = {"OPENAI_API_KEY": KEY, "ANTHROPIC_API_KEY": KEY}
    gw = gateway({"o": provider(echo, api_key_env="OPENAI_API_KEY"),
                  "an": provider(anthropic, "anthropic", api_key_env="ANTHROPIC_API_KEY")}, recorder, environ, store_text=True)
    errors = []
    try:
        for providers in (("o",), ("o", "an")):
            with pytest.raises(ModelError) as caught:
                await gw.chat(model_call(*providers), [USER], [])
            errors.append(caught.value)
    finally:
        await gw.aclose()
    assert echo.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert anthropic.requests[0].headers["x-api-key"] == KEY
    assert "[redacted]" in errors[0].message
    everything = [str(e) for e in errors] + [json.dumps(recorder.events)] + [r.getMessage() for r in caplog.records]
    assert all(KEY not in text for text in everything), everything
    assert len(recorder.calls()) == 3 and caplog.records, "the failures were recorded and logged"


async def test_a_key_that_is_not_a_header_value_is_refused_without_echoing_it(fake_model: FakeModelServer) -> None:
    bad = "sk-line1\nInjected: header"
    gw = gateway({"a": provider(fake_model, api_key_env="A_KEY")}, Recorder(), {"A_KEY": bad})
    with pytest.raises(ModelError) as caught:
        await gw.chat(model_call("a"), [USER], [])
    await gw.aclose()
    assert caught.value.code == "provider_unavailable"
    assert "A_KEY" in caught.value.message and "sk-line1" not in caught.value.message
    assert fake_model.requests == []


async def test_store_text_adds_the_prompt_and_answer(fake_model: FakeModelServer) -> None:
    fake_model.script(Reply(text="the answer"), Reply(text="again"))
    plain, stored = Recorder(), Recorder()
    for recorder, store_text in ((plain, False), (stored, True)):
        gw = gateway({"a": provider(fake_model)}, recorder, store_text=store_text)
        try:
            await gw.chat(model_call("a"), [USER], [])
        finally:
            await gw.aclose()
    assert set(plain.calls()[0]) == FIELDS
    event = stored.calls()[0]
    assert set(event) == FIELDS | {"prompt", "answer"}
    assert json.loads(event["prompt"]) == [USER]
    assert json.loads(event["answer"])["content"] == "again"


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_connections_are_reused_between_calls_plain_and_streamed(fake_model: FakeModelServer, kind: str) -> None:
    fake_model.script(*[Reply(text=f"answer number {i}") for i in range(6)])
    gw = gateway({"a": provider(fake_model, kind)}, Recorder())

    async def on_token(text: str) -> None:
        return None

    try:
        for i in range(6):
            await gw.chat(model_call("a"), [USER], [], on_token=on_token if i % 2 else None)
    finally:
        await gw.aclose()
    assert fake_model.connections_seen == 1


async def test_events_encode_for_the_audit_log_and_feed_the_daemon_metrics(fake_model: FakeModelServer) -> None:
    from covenant.audit.events import EVENT_TYPES, encode_event_data
    from covenant.daemon.metrics import Metrics
    from covenant.models import ModelGateway

    fake_model.script(Reply.error(500), Reply(text="ok", usage=(7, 2)))
    encoded: list[bytes] = []

    async def audit(type_: str, data: dict) -> None:
        assert type_ in EVENT_TYPES
        encoded.append(encode_event_data(type_, data))  # refuses floats and odd types, as the writer does

    metrics = Metrics()
    gw = ModelGateway({"a": provider(fake_model)}, environ={}, audit=audit, observe=metrics.observe_model_call)
    try:
        with pytest.raises(ModelError):
            await gw.chat(model_call("a"), [USER], [])
        await gw.chat(model_call("a"), [USER], [])
    finally:
        await gw.aclose()
    assert len(encoded) == 2
    body = metrics.render()[0].decode()
    assert 'covenant_model_calls_total{agent="triage@local",outcome="http_error",provider="a"} 1.0' in body
    assert 'covenant_retries_total{agent="triage@local",kind="model"}' not in body  # two calls of one attempt each
    assert 'covenant_model_tokens_total{agent="triage@local",direction="input",provider="a"} 7.0' in body


@pytest.mark.parametrize(
    ("messages", "tools", "where"),
    [
        ([], [], "messages: must be a non-empty list"),
        ("hello", [], "messages: must be a non-empty list"),
        ([{"role": "robot", "content": "x"}], [], "messages[0].role"),
        ([USER, {"role": "tool", "content": "x"}], [], "messages[1].tool_call_id"),
        ([USER, {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}], [],
         "messages[1].tool_calls[0]: needs a non-empty string id"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "file:///etc/shadow"}]}], [], "messages[0].content[0]"),
        ([USER], [{"type": "function", "function": {"name": "rm -rf", "parameters": {}}}], "tools[0].function.name"),
        ([USER], [{"type": "code_interpreter"}], "tools[0]"),
    ],
)
async def test_a_malformed_request_from_a_replica_is_refused_before_any_request(
    fake_model: FakeModelServer, messages, tools, where
) -> None:
    recorder = Recorder()
    gw = gateway({"a": provider(fake_model, "anthropic")}, recorder)
    with pytest.raises(ModelError) as caught:
        await gw.chat(model_call("a"), messages, tools)
    await gw.aclose()
    assert caught.value.code == "protocol_error"
    assert caught.value.message.startswith(f"the model request is malformed: {where}")
    assert fake_model.requests == [] and recorder.events == []


async def test_an_interrupted_call_is_still_recorded(fake_model: FakeModelServer) -> None:
    import trio

    fake_model.script(Reply(text="slow", delay_s=60), Reply(text="a b c d e f"))
    recorder = Recorder()
    gw = gateway({"a": provider(fake_model)}, recorder)

    async def reader_gone(text: str) -> None:
        raise BrokenPipeError("the client went away")

    try:
        with trio.move_on_after(0.5) as scope:  # the intent's timeout, say
            await gw.chat(model_call("a"), [USER], [])
        assert scope.cancelled_caught
        with pytest.raises(BrokenPipeError):
            await gw.chat(model_call("a"), [USER], [], on_token=reader_gone)
    finally:
        await gw.aclose()
    assert summary(recorder) == [("a", 1, None, "error"), ("a", 1, 200, "error")]


async def test_a_provider_model_pins_the_id_sent_to_it(fake_model_factory) -> None:
    cloud, local = fake_model_factory(), fake_model_factory()
    cloud.script(Reply.error(500))
    local.script(Reply(text="local"))
    recorder = Recorder()
    gw = gateway({"cloud": provider(cloud), "ollama": provider(local, model="llama3.2")}, recorder)
    call = model_call("cloud", "ollama")
    assert [p.model for p in gw.plan(call.models).attempts] == ["model-a", "llama3.2"]
    try:
        result = await gw.chat(call, [USER], [])
    finally:
        await gw.aclose()
    assert (result.provider, result.model) == ("ollama", "llama3.2")
    assert [r.body["model"] for r in cloud.requests + local.requests] == ["model-a", "llama3.2"]
    assert [e["model"] for e in recorder.calls()] == ["model-a", "llama3.2"]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_stream_without_its_end_marker_is_not_taken_for_an_answer(fake_model_factory, kind: str) -> None:
    first, second = fake_model_factory(), fake_model_factory()
    first.script(Reply.tools(ToolCall("classify_ticket", {"text": "x"}), end_marker=False))  # no text shown yet
    second.script(Reply(text="complete"))
    recorder = Recorder()

    async def on_token(text: str) -> None:
        return None

    gw = gateway({"a": provider(first, kind), "b": provider(second)}, recorder)
    try:
        result = await gw.chat(model_call("a", "b"), [USER], [], on_token=on_token)
    finally:
        await gw.aclose()
    assert result.text == "complete"
    assert summary(recorder) == [("a", 1, 200, "error"), ("b", 2, 200, "ok")]


async def test_reconfigure_points_a_provider_elsewhere_and_drops_its_old_connections(fake_model_factory) -> None:
    old, new = fake_model_factory(), fake_model_factory()
    old.script(Reply(text="old"))
    new.script(Reply(text="new"))
    gw = gateway({"a": provider(old), "b": provider(new)}, Recorder())
    try:
        assert (await gw.chat(model_call("a"), [USER], [])).text == "old"
        gw.reconfigure({"a": provider(new)})
        assert (await gw.chat(model_call("a"), [USER], [])).text == "new"
        assert gw.plan(model_call("b").models).skipped[0].reason == "no [providers.b] table in covenant.toml"
    finally:
        await gw.aclose()
    assert len(old.requests) == 1 and len(new.requests) == 1


async def test_a_call_under_way_finishes_with_its_config_when_a_reload_removes_its_provider(fake_model: FakeModelServer) -> None:
    import trio

    fake_model.script(Reply(text="finished", delay_s=1.0))
    gw = gateway({"a": provider(fake_model)}, Recorder())
    results = []

    async def one() -> None:
        results.append(await gw.chat(model_call("a"), [USER], []))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            with trio.fail_after(30):
                while not fake_model.requests:
                    await trio.sleep(0.01)
            gw.reconfigure({})
        with pytest.raises(ModelError, match="provider_unavailable"):
            await gw.chat(model_call("a"), [USER], [])
    finally:
        await gw.aclose()
    assert [r.text for r in results] == ["finished"]
