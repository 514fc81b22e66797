"""Runner overhead against a raw ``subprocess.run`` of the same agent.

For a python3, a node and a rust-bin echo agent (tests/runtime/agents/), with
the same stdin line: p50 round trip sequentially (ratio runner/raw) and
throughput at concurrency 8 (ratio runner/raw). The runner runs as the daemon
does: child subreaper, default RuntimeConfig (setpriv --pdeathsig wrapper,
sampler at 50 ms). Targets: python3 sequential ratio < 1.15; throughput
ratio at concurrency 8 >= 0.80.

    .venv/bin/python bench/runner_overhead.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
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
from covenant.runtime.host import set_child_subreaper  # noqa: E402
from covenant.runtime.runner import Runner  # noqa: E402

AGENTS = REPO / "tests" / "runtime" / "agents"
CONCURRENCY = 8


def payload() -> dict:
    return {"id": str(uuid.uuid4()), "text": "hello", "issuer": {"display": "bench@host", "pubkey": ""},
            "issued_at": 0, "priority": "normal", "parent": None}


def build_rust(tmp: Path) -> Path | None:
    cargo = shutil.which("cargo")
    if cargo is None:
        return None
    subprocess.run([cargo, "build", "--quiet", "--release", "--offline", "--manifest-path",
                    str(AGENTS / "echo-rs" / "Cargo.toml"), "--target-dir", str(tmp)], check=True)
    return tmp / "release" / "echo-rs"


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


def bench_raw(spec: AgentSpec, config: RuntimeConfig, runs: int) -> tuple[float, float]:
    argv = raw_argv(spec, config)
    env = {"PATH": config.path, "HOME": tempfile.gettempdir(), "LANG": "C.UTF-8"}
    for _ in range(3):
        raw_once(argv, spec.root, env)
    p50 = statistics.median(raw_once(argv, spec.root, env) for _ in range(runs))
    start = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(lambda _: raw_once(argv, spec.root, env), range(runs * 2)))
    throughput = runs * 2 / (time.perf_counter() - start)
    return p50, throughput


async def bench_runner(spec: AgentSpec, config: RuntimeConfig, runs: int, scratch: Path) -> tuple[float, float]:
    async with Runner.open(config, scratch_root=scratch) as runner:

        async def once() -> float:
            start = time.perf_counter()
            record = await runner.run(spec, payload())
            elapsed = time.perf_counter() - start
            assert record.outcome == "ok", record
            return elapsed

        for _ in range(3):
            await once()
        times = [await once() for _ in range(runs)]
        total = runs * 2
        counter = iter(range(total))

        async def worker() -> None:
            for _ in counter:
                await once()

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(worker)
        throughput = total / (time.perf_counter() - start)
    return statistics.median(times), throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="sequential runs per agent (concurrent: 2x)")
    args = parser.parse_args()
    set_child_subreaper()
    config = RuntimeConfig()
    print(f"python3 = {default_python3()}  node = {shutil.which('node', path=config.path)}  "
          f"concurrency = {CONCURRENCY}  runs = {args.runs}")
    with tempfile.TemporaryDirectory() as tmp:
        specs = [agent("python3", AGENTS / "echo.py")]
        if shutil.which("node", path=config.path):
            specs.append(agent("node", AGENTS / "echo.js"))
        rust = build_rust(Path(tmp) / "target")
        if rust is not None:
            specs.append(agent("rust-bin", rust))
        print(f"{'agent':<9} {'raw p50':>9} {'runner p50':>11} {'ratio':>6}   "
              f"{'raw /s':>7} {'runner /s':>9} {'ratio':>6}")
        for spec in specs:
            raw_p50, raw_tp = bench_raw(spec, config, args.runs)
            run_p50, run_tp = trio.run(bench_runner, spec, config, args.runs, Path(tmp) / "scratch")
            print(f"{spec.runtime:<9} {raw_p50 * 1000:7.2f}ms {run_p50 * 1000:9.2f}ms {run_p50 / raw_p50:6.3f}   "
                  f"{raw_tp:7.1f} {run_tp:9.1f} {run_tp / raw_tp:6.3f}")


if __name__ == "__main__":
    main()
