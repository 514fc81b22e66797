"""What the model gateway adds to one model call: ModelGateway.chat vs httpx straight to the provider.

The provider is the scripted fake (tests/fakes/model_server.py) in its own process, answering
every request at once with the same small completion. In this process, under trio, two clients
call it with the same realistic turn (system prompt, user message, an earlier tool call and its
result, two tools offered):

1. raw: one ``httpx.AsyncClient`` posting the OpenAI request body (JSON-encoded here) and decoding
   the answer's JSON: the floor of HTTP + JSON + the fake;
2. gateway: ``ModelGateway.chat`` with one provider pointed at the same fake: request check, plan,
   key lookup, adapter conversion both ways, usage and budget, the ``model.call`` event data and
   the metrics hook (the audit sink is an in-memory list here: the signed log's own cost is issue
   4's benchmark, and the daemon pays it per event).

Both are measured in alternating blocks so drift hits both alike; plain and streamed
(``stream: true``) answers. Prints p50/p90 per call and what the gateway adds.

    .venv/bin/python bench/model_gateway.py [--calls N] [--blocks N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import trio  # noqa: E402

from covenant.config import ProviderConfig  # noqa: E402
from covenant.daemon.metrics import Metrics  # noqa: E402
from covenant.models import AgentModels, ModelCall, ModelGateway, TokenBudget  # noqa: E402

TOOLS = [
    {"type": "function", "function": {"name": "classify_ticket", "description": "Label a ticket technical or billing.",
                                      "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                                                     "required": ["text"]}}},
    {"type": "function", "function": {"name": "web-fetch", "description": "Fetch a URL.",
                                      "parameters": {"type": "object", "properties": {"url": {"type": "string"}},
                                                     "required": ["url"]}}},
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You triage support tickets. " * 20},
    {"role": "user", "content": "I was charged twice for my subscription this month, please refund the second charge."},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": {
        "name": "classify_ticket", "arguments": json.dumps({"text": "charged twice"})}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "billing"},
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def raw_call(client: httpx.AsyncClient, url: str, stream: bool) -> None:
    body: dict[str, Any] = {"model": "model-a", "messages": MESSAGES, "tools": TOOLS}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        async with client.stream("POST", url, content=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"}) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    json.loads(line[6:])
        return
    response = await client.post(url, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    data = response.json()
    assert data["choices"][0]["message"]["content"]


async def run(port: int, calls: int, blocks: int) -> dict[str, dict[str, list[float]]]:
    base = f"http://127.0.0.1:{port}/v1"
    events: list[tuple[str, dict[str, Any]]] = []

    async def audit(type_: str, data: dict[str, Any]) -> None:
        events.append((type_, data))

    metrics = Metrics()
    gateway = ModelGateway({"fake": ProviderConfig(kind="openai", base_url=base, api_key_env="BENCH_KEY")},
                           environ={"BENCH_KEY": "sk-bench"}, audit=audit, observe=metrics.observe_model_call)
    models = AgentModels(providers=("fake",), alias_map={"default": "model-a"}, default_alias="default")
    budget = TokenBudget(limit=10**12)
    results: dict[str, dict[str, list[float]]] = {"plain": {"raw": [], "gateway": []}, "stream": {"raw": [], "gateway": []}}

    async def on_token(text: str) -> None:
        return None

    async with httpx.AsyncClient(trust_env=False) as client:
        for mode in ("plain", "stream"):
            stream = mode == "stream"
            for _ in range(20):  # warm both paths: connections, imports, caches
                await raw_call(client, f"{base}/chat/completions", stream)
                await gateway.chat(ModelCall("i", "bench@local", models, budget), MESSAGES, TOOLS,
                                   on_token=on_token if stream else None)
            for _ in range(blocks):
                for kind in ("raw", "gateway"):
                    for _ in range(calls // blocks):
                        started = time.perf_counter()
                        if kind == "raw":
                            await raw_call(client, f"{base}/chat/completions", stream)
                        else:
                            await gateway.chat(ModelCall("i", "bench@local", models, budget), MESSAGES, TOOLS,
                                               on_token=on_token if stream else None)
                        results[mode][kind].append((time.perf_counter() - started) * 1000)
            events.clear()
    await gateway.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per path and mode (default 2000)")
    parser.add_argument("--blocks", type=int, default=10, help="alternating blocks (default 10)")
    args = parser.parse_args()
    fake = subprocess.Popen([sys.executable, "-c", "from tests.fakes.model_server import main; main()",
                             "--text", "A billing ticket: refund due."],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert fake.stdout is not None
        port = int(fake.stdout.readline())
        results = trio.run(run, port, args.calls, args.blocks)
    finally:
        fake.terminate()
        fake.wait(timeout=30)
    print(f"model gateway overhead, {args.calls} calls per path, {args.blocks} alternating blocks, fake provider in its own process")
    print("| answer | raw httpx p50 (ms) | gateway p50 (ms) | added p50 (ms) | ratio p50 | raw p90 | gateway p90 |")
    print("|---|---|---|---|---|---|---|")
    for mode, paths in results.items():
        raw, gw = paths["raw"], paths["gateway"]
        raw50, gw50 = statistics.median(raw), statistics.median(gw)
        print(f"| {mode} | {raw50:.3f} | {gw50:.3f} | {gw50 - raw50:+.3f} | {gw50 / raw50:.2f} | "
              f"{percentile(raw, 0.9):.3f} | {percentile(gw, 0.9):.3f} |")


if __name__ == "__main__":
    main()
