"""Adapters of the test-driven loop at the gateway: sent as the model or a lora field, skipped where not served."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from covenant.config import ProviderConfig
from covenant.models import ModelError
from tests.fakes import Reply
from tests.models.helpers import Recorder, gateway, model_call, provider

USER = {"role": "user", "content": "write add"}


async def test_an_adapter_goes_as_the_model_or_as_lora_and_a_provider_without_it_is_skipped(fake_model_factory) -> None:
    bare, as_lora, as_model = fake_model_factory(), fake_model_factory(), fake_model_factory()
    as_lora.script(Reply(text="first"))
    as_model.script(Reply(text="second"))
    recorder = Recorder()
    gw = gateway({
        "bare": provider(bare),
        "lora": provider(as_lora, adapters={"add-v1": "add-lora"}, adapter_field="lora"),
        "model": provider(as_model, adapters={"add-v1": "add-model"}),
    }, recorder)
    try:
        call = dataclasses.replace(model_call("bare", "lora"), adapter="add-v1")
        assert (await gw.chat(call, [USER], [])).text == "first"
        call = dataclasses.replace(model_call("model"), adapter="add-v1")
        assert (await gw.chat(call, [USER], [])).text == "second"
        with pytest.raises(ModelError) as caught:
            await gw.chat(dataclasses.replace(model_call("bare", "lora"), adapter="other"), [USER], [])
    finally:
        await gw.aclose()
    assert bare.requests == [], "a provider that serves no such adapter was asked"
    (lora_request,) = as_lora.requests
    assert (lora_request.body["model"], lora_request.body["lora"]) == ("model-a", "add-lora")
    (model_request,) = as_model.requests
    assert model_request.body["model"] == "add-model" and "lora" not in model_request.body
    assert caught.value.code == "provider_error" and "'other'" in caught.value.message
    assert [e["model"] for e in recorder.calls()] == ["model-a", "add-model"]


@pytest.mark.parametrize("table", [{"bad id!": "x"}, {"ok": ""}, {"ok": 3}, ["add-v1"]])
def test_a_bad_adapters_table_is_refused(table: object) -> None:
    with pytest.raises(ValidationError):
        ProviderConfig(kind="openai", base_url="http://127.0.0.1:1/v1", adapters=table)
