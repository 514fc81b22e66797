"""Runner overhead against a raw ``subprocess.run`` of the same agent.

For a python3, a node and a rust-bin echo agent (tests/runtime/agents/), with
the same stdin line: p50 round trip sequentially (ratio runner/raw, and the
milliseconds added) and throughput at concurrency 8 (ratio runner/raw). The
runner runs as the daemon does: child subreaper, default RuntimeConfig
(PDEATHSIG wrapper, sampler at 50 ms). Raw and runner runs are interleaved in
small blocks in one process, so load from elsewhere on the box hits both
alike. Targets (issue 3): sequential ratio < 1.15; throughput ratio >= 0.80.
Prints a Markdown table that can be pasted into docs/runtime.md.

    .venv/bin/python bench/runner_overhead.py [--runs N] [--only python3,node,rust-bin]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from covenant.config import RuntimeConfig, default_python3  # noqa: E402
from covenant.manifest.model import AgentSpec  # noqa: E402
from covenant.runtime.contract import intent_line  # noqa: E402
from covenant.runtime.host import pdeathsig_wrapper, set_child_subreaper  # noqa: E402
from covenant.runtime.runner import Runner  # noqa: E402
from echo_agents import AGENTS, build_rust  # noqa: E402

CONCURRENCY = 8


def payload() -> dict:
    return {"id": str(uuid.uuid4()), "text": "hello", "issuer": {"display": "bench@host", "pubkey": ""},
            "issued_at": 0, "priority": "normal", "parent": None}



def agent(runtime: str, entry: Path) -> AgentSpec:
    return AgentSpec(id=f"echo-{runtime}@bench", name="echo", version="1", runtime=runtime, kind="agent.toml",
                     manifest_path=entry.parent / "agent.toml", root=entry.parent, entry=entry)


def raw_argv(spec: AgentSpec, config: RuntimeConfig) -> list[str]:
    if spec.runtime == "python3":
        return [config.python3, str(spec.entry)]
    if spec.runtime == "node":
        return [shutil.which("node", path=config.path) or "node", str(spec.entry)]
    return [str(spec.entry)]


def raw_once(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    line = intent_line(payload())
    start = time.perf_counter()
    done = subprocess.run(argv, input=line, capture_output=True, cwd=cwd, env=env)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0 and json.loads(done.stdout)["status"] == "ok", done
    return elapsed


BLOCK = 5
"""Sequential runs per side before switching sides."""
ROUNDS = 3
"""Concurrent batches per side, alternating."""


async def measure(spec: AgentSpec, config: RuntimeConfig, runs: int, scratch: Path) -> dict[str, float]:
    """Sequential p50s and concurrency-8 throughputs, raw and runner interleaved."""
    argv = raw_argv(spec, config)
    env = {"PATH": config.path, "HOME": tempfile.gettempdir(), "LANG": "C.UTF-8"}
    async with Runner.open(config, scratch_root=scratch) as runner:

        async def once() -> float:
            start = time.perf_counter()
            record = await runner.run(spec, payload())
            elapsed = time.perf_counter() - start
            assert record.outcome == "ok", record
            return elapsed

        for _ in range(3):
            raw_once(argv, spec.root, env)
            await once()
        raw_times: list[float] = []
        run_times: list[float] = []
        while len(raw_times) < runs:
            raw_times.extend(raw_once(argv, spec.root, env) for _ in range(BLOCK))
            for _ in range(BLOCK):
                run_times.append(await once())

        batch = max(CONCURRENCY * 2, runs * 2 // ROUNDS)
        raw_s = run_s = 0.0
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            for _ in range(ROUNDS):
                start = time.perf_counter()
                list(pool.map(lambda _: raw_once(argv, spec.root, env), range(batch)))
                raw_s += time.perf_counter() - start

                counter = iter(range(batch))

                async def worker() -> None:
                    for _ in counter:
                        await once()

                start = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for _ in range(CONCURRENCY):
                        nursery.start_soon(worker)
                run_s += time.perf_counter() - start
    total = batch * ROUNDS
    return {
        "raw_p50": statistics.median(raw_times),
        "run_p50": statistics.median(run_times),
        "raw_tp": total / raw_s,
        "run_tp": total / run_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="sequential runs per side and agent")
    parser.add_argument("--only", default="python3,node,rust-bin", help="comma-separated runtimes to measure")
    args = parser.parse_args()
    wanted = set(args.only.split(","))
    set_child_subreaper()
    config = RuntimeConfig()
    wrapper = pdeathsig_wrapper() if config.pdeathsig else None
    mechanism = "none" if wrapper is None else ("static helper, gated" if wrapper.gated else "setpriv")
    load = os.getloadavg()
    print(f"python3 = {default_python3()}  node = {shutil.which('node', path=config.path)}")
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"pdeathsig wrapper: {mechanism}; concurrency {CONCURRENCY}; {args.runs} sequential runs per side")
    print()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        specs = []
        if "python3" in wanted:
            specs.append(agent("python3", AGENTS / "echo.py"))
        if "node" in wanted and shutil.which("node", path=config.path):
            specs.append(agent("node", AGENTS / "echo.js"))
        if "rust-bin" in wanted:
            rust = build_rust(Path(tmp) / "target")
            if rust is not None:
                specs.append(agent("rust-bin", rust))
        for spec in specs:
            m = trio.run(measure, spec, config, args.runs, Path(tmp) / "scratch")
            rows.append(
                f"| {spec.runtime} | {m['raw_p50'] * 1000:.2f} | {m['run_p50'] * 1000:.2f} "
                f"| {(m['run_p50'] - m['raw_p50']) * 1000:+.2f} | {m['run_p50'] / m['raw_p50']:.3f} "
                f"| {m['raw_tp']:.1f} | {m['run_tp']:.1f} | {m['run_tp'] / m['raw_tp']:.3f} |"
            )
    print("| agent | raw p50 ms | runner p50 ms | added ms | seq ratio | raw/s (c=8) | runner/s (c=8) | tput ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
