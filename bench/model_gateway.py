"""What the model gateway adds to one model call: ModelGateway.chat vs httpx straight to the provider.

The provider is the scripted fake (tests/fakes/model_server.py) in its own process, answering
every request at once with the same small completion. In this process, under trio, two clients
call it with the same realistic turn (system prompt, user message, an earlier tool call and its
result, two tools offered):

1. raw httpx: one ``httpx.AsyncClient`` posting the OpenAI request body (JSON-encoded here) and
   decoding the answer's JSON;
   raw h11: the same through the gateway's own HTTP client (``covenant.models.http.ProviderHttp``)
   used directly: the floor of HTTP + JSON + the fake, and the baseline "added" is measured from;
2. gateway: ``ModelGateway.chat`` with one provider pointed at the same fake: request check, plan,
   key lookup, adapter conversion both ways, usage and budget, the ``model.call`` event data and
   the metrics hook, with an in-memory audit sink: what the gateway's own code adds;
3. gateway + audit: the same with the real signed audit log (``AuditLog`` on a temp directory, one
   durable group commit per ``model.call``), as the daemon runs it.

Both are measured in alternating blocks so drift hits both alike; plain and streamed
(``stream: true``) answers. Prints p50/p90 per call and what the gateway adds.

Then concurrency: 100 calls at once against a second fake that takes 200 ms per answer, 5 rounds,
through the gateway and through one ``httpx.AsyncClient`` (wall time and this process's CPU per
round). The fake's own limit is its 200 ms.

    .venv/bin/python bench/model_gateway.py [--calls N] [--blocks N] [--concurrent N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import trio  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from covenant.audit.writer import AuditLog  # noqa: E402
from covenant.config import AuditConfig, ProviderConfig  # noqa: E402
from covenant.daemon.metrics import Metrics  # noqa: E402
from covenant.models import AgentModels, ModelCall, ModelGateway, TokenBudget  # noqa: E402
from covenant.models.http import ProviderHttp  # noqa: E402
from covenant.sse import SseParser  # noqa: E402

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


async def h11_call(http: ProviderHttp, stream: bool) -> None:
    body: dict[str, Any] = {"model": "model-a", "messages": MESSAGES, "tools": TOOLS}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    async with http.post("/v1/chat/completions", {"content-type": "application/json"}, json.dumps(body).encode()) as response:
        if not stream:
            assert json.loads(await response.aread())["choices"][0]["message"]["content"]
            return
        parser = SseParser()
        while (data := await response.chunk()) is not None:
            for event in parser.feed(data):
                if event.data != "[DONE]":
                    json.loads(event.data)


async def run(port: int, calls: int, blocks: int) -> dict[str, dict[str, list[float]]]:
    base = f"http://127.0.0.1:{port}/v1"
    events: list[tuple[str, dict[str, Any]]] = []

    async def in_memory(type_: str, data: dict[str, Any]) -> None:
        events.append((type_, data))

    providers = {"fake": ProviderConfig(kind="openai", base_url=base, api_key_env="BENCH_KEY")}
    metrics = Metrics()
    models = AgentModels(providers=("fake",), alias_map={"default": "model-a"}, default_alias="default")
    budget = TokenBudget(limit=10**12)
    paths = ("raw httpx", "raw h11", "gateway", "gateway + audit")
    http = ProviderHttp(base, max_connections=10)
    results: dict[str, dict[str, list[float]]] = {mode: {p: [] for p in paths} for mode in ("plain", "stream")}

    async def on_token(text: str) -> None:
        return None

    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as folder:
        async with AuditLog.open(Path(folder), Ed25519PrivateKey.generate(), AuditConfig()) as audit:

            async def durable(type_: str, data: dict[str, Any]) -> None:
                await audit.record(type_, data)

            gateways = {
                "gateway": ModelGateway(providers, environ={"BENCH_KEY": "sk-bench"}, audit=in_memory,
                                        observe=metrics.observe_model_call),
                "gateway + audit": ModelGateway(providers, environ={"BENCH_KEY": "sk-bench"}, audit=durable,
                                                observe=metrics.observe_model_call),
            }
            async with httpx.AsyncClient(trust_env=False) as client:

                async def one(path: str, stream: bool) -> None:
                    if path == "raw httpx":
                        await raw_call(client, f"{base}/chat/completions", stream)
                    elif path == "raw h11":
                        await h11_call(http, stream)
                    else:
                        await gateways[path].chat(ModelCall("i", "bench@local", models, budget), MESSAGES, TOOLS,
                                                  on_token=on_token if stream else None)

                for mode in ("plain", "stream"):
                    stream = mode == "stream"
                    for _ in range(20):  # warm every path: connections, imports, caches
                        for path in paths:
                            await one(path, stream)
                    for _ in range(blocks):
                        for path in paths:
                            for _ in range(calls // blocks):
                                started = time.perf_counter()
                                await one(path, stream)
                                results[mode][path].append((time.perf_counter() - started) * 1000)
                    events.clear()
            for gateway in gateways.values():
                await gateway.aclose()
            await http.aclose()
    return results


async def concurrent(port: int, width: int, rounds: int = 5) -> dict[str, list[tuple[float, float]]]:
    """(wall s, CPU s) per round of ``width`` calls at once, through the gateway and through httpx."""
    base = f"http://127.0.0.1:{port}/v1"

    async def audit(type_: str, data: dict[str, Any]) -> None:
        return None

    gateway = ModelGateway({"fake": ProviderConfig(kind="openai", base_url=base)}, environ={}, audit=audit)
    models = AgentModels(providers=("fake",), alias_map={"default": "model-a"}, default_alias="default")
    budget = TokenBudget(limit=10**12)
    client = httpx.AsyncClient(trust_env=False, limits=httpx.Limits(max_connections=width, max_keepalive_connections=width))

    async def through_gateway() -> None:
        await gateway.chat(ModelCall("i", "bench@local", models, budget), MESSAGES, TOOLS)

    async def through_httpx() -> None:
        await raw_call(client, f"{base}/chat/completions", False)

    out: dict[str, list[tuple[float, float]]] = {"gateway": [], "httpx": []}
    for _ in range(rounds + 1):  # the first round opens the connections and is not counted
        for name, call in (("gateway", through_gateway), ("httpx", through_httpx)):
            wall, cpu = time.perf_counter(), time.process_time()
            async with trio.open_nursery() as nursery:
                for _ in range(width):
                    nursery.start_soon(call)
            out[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    await gateway.aclose()
    await client.aclose()
    return {name: rows[1:] for name, rows in out.items()}


def _fake(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", "from tests.fakes.model_server import main; main()", *args],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per path and mode (default 2000)")
    parser.add_argument("--blocks", type=int, default=10, help="alternating blocks (default 10)")
    parser.add_argument("--concurrent", type=int, default=100, help="calls at once in the concurrency part (default 100)")
    args = parser.parse_args()
    fake = _fake("--text", "A billing ticket: refund due.")
    slow = _fake("--text", "A billing ticket: refund due.", "--delay-s", "0.2")
    try:
        assert fake.stdout is not None and slow.stdout is not None
        port, slow_port = int(fake.stdout.readline()), int(slow.stdout.readline())
        results = trio.run(run, port, args.calls, args.blocks)
        rounds = trio.run(concurrent, slow_port, args.concurrent)
    finally:
        for process in (fake, slow):
            process.terminate()
            process.wait(timeout=30)
    print(f"model gateway overhead, {args.calls} calls per path, {args.blocks} alternating blocks, "
          "fake provider in its own process; ms per call")
    print("(added and ratio against raw h11, the same HTTP client without the gateway)")
    print("| answer | path | p50 | p90 | added p50 | ratio p50 |")
    print("|---|---|---|---|---|---|")
    for mode, paths in results.items():
        raw50 = statistics.median(paths["raw h11"])
        for path, times in paths.items():
            p50 = statistics.median(times)
            added = "" if path == "raw h11" else f"{p50 - raw50:+.3f}"
            ratio = "" if path == "raw h11" else f"{p50 / raw50:.2f}"
            print(f"| {mode} | {path} | {p50:.3f} | {percentile(times, 0.9):.3f} | {added} | {ratio} |")
    print(f"\n{args.concurrent} calls at once, fake answering in 200 ms, 5 rounds (wall s / this process's CPU s)")
    print("| client | median wall | rounds (wall) | median CPU |")
    print("|---|---|---|---|")
    for name, rows in rounds.items():
        walls = [wall for wall, _ in rows]
        cpus = [cpu for _, cpu in rows]
        print(f"| {name} | {statistics.median(walls):.3f} | {' '.join(f'{w:.3f}' for w in walls)} | "
              f"{statistics.median(cpus):.3f} |")


if __name__ == "__main__":
    main()
