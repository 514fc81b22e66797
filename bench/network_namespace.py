"""What an agent's own network namespace adds to a dispatch and to a process-tool call (issue 35).

Before, an agent with ``network = "full"`` and every process tool ran in the host's network
namespace; now each enters a network namespace of its uid, held open per network mode, at exec: one
``setns`` on the holder's pidfd, the same call that already entered the uid's private /tmp. Both
sides run in one process, interleaved in small blocks (load from elsewhere hits both alike), on the
same build: "host network" is a runner told that its agents cannot get namespaces of their own and
that ``[isolation] network = "host"`` accepts it — exactly the earlier path (private /tmp only).

1. dispatch: ``Runner.run`` of the python3 echo agent with ``network = "full"`` (slirp4netns egress),
   its namespace already made;
2. tool call: ``Runner.run_tool`` of a python3 process tool that declares no network (its own
   loopback only), against the same tool in the host's network.

Goal: at most 1 ms added, p50, for each. Needs root. Prints a Markdown table for docs/performance.md.

    .venv/bin/python bench/network_namespace.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from covenant.config import IsolationConfig, RuntimeConfig  # noqa: E402
from covenant.manifest.model import AgentSpec, Resources  # noqa: E402
from covenant.runtime.host import set_child_subreaper  # noqa: E402
from covenant.runtime.isolation import Isolation, open_isolation  # noqa: E402
from covenant.runtime.runner import Runner  # noqa: E402
from echo_agents import AGENTS  # noqa: E402

BLOCK = 5
TOOL = "import json, sys\njson.loads(sys.stdin.readline())\nprint(json.dumps({'ok': True}))\n"


def _isolation(state: Path, low: int, *, host_network: bool) -> Isolation:
    return open_isolation(IsolationConfig(uid_range=(low, low + 99), network="host" if host_network else "namespaced"),
                          state)


def payload() -> dict:
    return {"id": str(uuid.uuid4()), "text": "hello", "issuer": {"display": "bench@host", "pubkey": ""},
            "issued_at": 0, "priority": "normal", "parent": None}


async def bench(runs: int, base: Path) -> dict[str, tuple[float, float]]:
    package = base / "package"
    package.mkdir(mode=0o755)
    (package / "echo.py").write_bytes((AGENTS / "echo.py").read_bytes())
    (package / "tool.py").write_text(TOOL)
    for path in (package / "echo.py", package / "tool.py"):
        path.chmod(0o644)
    spec = AgentSpec(id="echo@bench", name="echo", version="1", runtime="python3", kind="agent.toml",
                     manifest_path=package / "agent.toml", root=package, entry=package / "echo.py",
                     resources=Resources(network="full"))
    config = RuntimeConfig(python3="/usr/bin/python3")
    host_iso = _isolation(base / "host-state", 730000, host_network=True)
    own_iso = _isolation(base / "own-state", 730200, host_network=False)
    async with Runner.open(config, scratch_root=base / "s1", isolation=host_iso) as host, \
            Runner.open(config, scratch_root=base / "s2", isolation=own_iso) as own:
        # The earlier path on this build: no network namespace of the agent's own (private /tmp only).
        host.plans.networks = None
        host.isolation.network_problem = "the benchmark's before: agents in the host's network"
        assert own.isolation.to_json()["network"]["egress"], own.isolation.to_json()

        async def dispatch(runner: Runner) -> float:
            start = time.perf_counter()
            record = await runner.run(spec, payload())
            elapsed = time.perf_counter() - start
            assert record.outcome == "ok", record
            return elapsed

        async def tool(runner: Runner) -> float:
            # Before: in the host's network (no wrapper, no namespace); now: the uid's "off" namespace.
            network = "full" if runner is host else "off"
            start = time.perf_counter()
            run = await runner.run_tool(spec, ("/usr/bin/python3", str(package / "tool.py")), b"{}\n",
                                        run_id=f"bench:tool:{uuid.uuid4().hex[:12]}", wall_ms=10_000, network=network,
                                        priority="normal")
            elapsed = time.perf_counter() - start
            assert run.outcome == "ok", run
            return elapsed

        results = {}
        for name, measure in (("dispatch", dispatch), ("tool", tool)):
            for _ in range(5):
                await measure(host)
                await measure(own)
            before: list[float] = []
            after: list[float] = []
            while len(before) < runs:
                for _ in range(BLOCK):
                    before.append(await measure(host))
                for _ in range(BLOCK):
                    after.append(await measure(own))
            results[name] = (statistics.median(before), statistics.median(after))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per side of each measurement")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: agents run as other uids, in namespaces covenant makes")
    set_child_subreaper()
    load = os.getloadavg()
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{args.runs} runs per side")
    base = Path(tempfile.mkdtemp(prefix="covenant-bench-"))
    base.chmod(0o711)
    try:
        results = trio.run(bench, args.runs, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print("| measured (p50) | host network ms | own namespace ms | added ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    labels = {"dispatch": 'dispatch of the python3 echo agent, network = "full" (slirp4netns egress)',
              "tool": "process tool call (python3), no network capability (its own loopback)"}
    for name, (before, after) in results.items():
        print(f"| {labels[name]} | {before * 1000:.3f} | {after * 1000:.3f} | {(after - before) * 1000:+.3f} "
              f"| {after / before:.3f} |")


if __name__ == "__main__":
    main()
