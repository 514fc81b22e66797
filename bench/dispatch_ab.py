"""Before and after for the dispatch hot path: two live daemons, one per checkout, in alternating blocks.

``--base PATH`` is another checkout (a ``git worktree`` of the older commit), run on this venv; the
other daemon is this checkout's. Both serve the rust-bin echo agent from their own throwaway homes.

- Sequential: blocks of ``--per-block`` dispatches alternate between the two daemons (the order flips
  every block), so both see the same minutes of the box. Per daemon: its CPU per dispatch (user +
  system, its agents excluded) and the round-trip p50 of the in-process client.
- Concurrent (``--concurrency C``, 0 to skip): C client threads for ``--window`` seconds against each
  daemon in turn, ``--rounds`` times. Per round: dispatches/s, the daemon's CPU as a share of one core
  and per dispatch, this client process's share, and how busy the whole box was (``/proc/stat``):
  what is left of the two cores for the daemon once the agents, the client and the kernel had theirs.
  Then the means and medians, how many rounds this checkout won and the mean ratio of the pairs.
  Many short rounds (the default: 14 of 3 s) tell two daemons apart where a few long ones cannot: the
  box drifts by ±15 % over minutes, and each pair of short rounds sees the same stretch of it.
- For both: a 95 % bootstrap interval of the mean ratio of the pairs (of blocks, of rounds). An
  interval that holds 1.0 means this run cannot tell the two daemons apart.

    .venv/bin/python bench/dispatch_ab.py --base /tmp/base [--blocks 20] [--per-block 100]
        [--concurrency 16] [--window 3] [--rounds 14] [--keep]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402

from daemon_dispatch import (  # noqa: E402
    Agent, DaemonCPU, Throwaway, daemon_once, granted_identity, install_agents, start_daemon, stop_and_clean, throwaway_home,
    use_home,
)
from covenant.config import RuntimeConfig  # noqa: E402
from covenant.policy.identities import UserIdentity  # noqa: E402


@dataclass
class Side:
    """One daemon under test and what was measured of it."""

    name: str
    home: Throwaway
    identity: UserIdentity
    agent: Agent
    process: DaemonCPU
    cpu_s: float = 0.0
    dispatches: int = 0
    latencies: list[float] = field(default_factory=list)
    rounds: list[str] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    """Dispatches per second of each concurrent round."""
    block_cpu: list[float] = field(default_factory=list)
    """CPU seconds per dispatch of each sequential block."""

    def use(self) -> None:
        use_home(self.home)

    def once(self) -> float:
        return daemon_once(self.agent, self.identity, self.home.socket_path)[0]


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def box_busy() -> tuple[int, int]:
    """(all jiffies, idle + iowait jiffies) of the whole box so far."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]


def paired_interval(this: list[float], base: list[float], resamples: int = 4000) -> tuple[float, float]:
    """95 % bootstrap interval of the mean of the pairs' ratios this/base (a fixed seed: reruns agree).

    An interval that holds 1.0 means the run cannot tell the two daemons apart.
    """
    ratios = [t / b for t, b in zip(this, base)]
    draw = random.Random(0)
    means = sorted(statistics.mean(draw.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def start_side(name: str, checkout: str | None) -> tuple[Side, subprocess.Popen[bytes]]:
    home = throwaway_home(f"covenant-ab-{name}-", {"PYTHONPATH": checkout} if checkout else None)
    identity = granted_identity(home.env)
    agent = next(a for a in install_agents(home.home, home.tmp, RuntimeConfig()) if a.runtime == "rust-bin")
    daemon = start_daemon(home.env, home.socket_path, home.tmp / "daemon.log")
    side = Side(name, home, identity, agent, DaemonCPU(daemon.pid))
    for _ in range(50):  # warm: imports done, scratch dirs ready
        side.once()
    return side, daemon


def sequential_block(side: Side, count: int) -> None:
    side.use()
    before = side.process.seconds()
    side.latencies += [side.once() for _ in range(count)]
    spent = side.process.seconds() - before
    side.cpu_s += spent
    side.dispatches += count
    side.block_cpu.append(spent / count)


def concurrent_round(side: Side, concurrency: int, window_s: float) -> None:
    side.use()
    me = psutil.Process()
    done = [0]
    lock = threading.Lock()
    stop = time.monotonic() + window_s

    def client() -> None:
        while time.monotonic() < stop:
            side.once()
            with lock:
                done[0] += 1

    daemon0, me0, (all0, idle0) = side.process.seconds(), cpu_seconds(me), box_busy()
    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    daemon_s, me_s, (all1, idle1) = side.process.seconds() - daemon0, cpu_seconds(me) - me0, box_busy()
    busy = (1 - (idle1 - idle0) / max(1, all1 - all0)) * (os.cpu_count() or 1) * 100
    side.rates.append(done[0] / wall)
    side.rounds.append(
        f"{done[0] / wall:6.0f}/s  daemon {daemon_s / wall * 100:3.0f} % of a core, {daemon_s / done[0] * 1000:.2f} ms "
        f"per dispatch; client {me_s / wall * 100:.0f} %; box busy {busy:.0f} % of {(os.cpu_count() or 1) * 100} %"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the other checkout (e.g. a git worktree of the old commit)")
    parser.add_argument("--blocks", type=int, default=20, help="sequential blocks per daemon")
    parser.add_argument("--per-block", type=int, default=100, help="dispatches per sequential block")
    parser.add_argument("--concurrency", type=int, default=16, help="client threads for the concurrent rounds; 0 skips them")
    parser.add_argument("--window", type=float, default=3.0, help="seconds per concurrent round")
    parser.add_argument("--rounds", type=int, default=14, help="concurrent rounds per daemon")
    parser.add_argument("--keep", action="store_true", help="keep the temp homes afterwards")
    args = parser.parse_args()
    if not (Path(args.base) / "covenant" / "__init__.py").is_file():
        raise SystemExit(f"--base {args.base}: no covenant package there (make one with `git worktree add PATH REV`)")

    if os.environ.get("BENCH_CHECKOUT"):
        raise SystemExit("unset BENCH_CHECKOUT: this bench runs both checkouts itself (--base names the other)")
    started: list[tuple[Side, subprocess.Popen[bytes]]] = []
    try:
        started = [start_side("base", os.path.abspath(args.base)), start_side("this", None)]
        sides = [side for side, _ in started]
        for block in range(args.blocks):
            for side in sides if block % 2 == 0 else sides[::-1]:
                sequential_block(side, args.per_block)
        for round_ in range(args.rounds if args.concurrency else 0):
            for side in sides if round_ % 2 == 0 else sides[::-1]:
                concurrent_round(side, args.concurrency, args.window)
    finally:
        for side, daemon in started:
            stop_and_clean([daemon], side.home.tmp, args.keep)

    base, this = sides
    print(f"rust-bin echo agent; base = {args.base}, this = {Path(__file__).resolve().parents[1]}; "
          f"nproc={os.cpu_count()} load={os.getloadavg()[0]:.2f}")
    print("| daemon | CPU per dispatch (ms) | round trip p50 (ms) | dispatches |")
    print("|---|---:|---:|---:|")
    for side in sides:
        print(f"| {side.name} | {side.cpu_s / side.dispatches * 1000:.3f} | "
              f"{statistics.median(side.latencies) * 1000:.3f} | {side.dispatches} |")
    low, high = paired_interval(this.block_cpu, base.block_cpu)
    print(f"this/base CPU per dispatch: {this.cpu_s / this.dispatches / (base.cpu_s / base.dispatches):.3f} "
          f"(pairs of blocks: 95 % interval of the mean ratio {low:.3f}–{high:.3f})")
    for side in sides:
        for n, line in enumerate(side.rounds, 1):
            print(f"c={args.concurrency} {side.name} round {n}: {line}")
    if base.rates:
        ahead = sum(t > b for t, b in zip(this.rates, base.rates))
        ratio = statistics.mean(t / b for t, b in zip(this.rates, base.rates))
        low, high = paired_interval(this.rates, base.rates)
        print(f"c={args.concurrency} per s, mean (median): base {statistics.mean(base.rates):.0f} "
              f"({statistics.median(base.rates):.0f}), this {statistics.mean(this.rates):.0f} "
              f"({statistics.median(this.rates):.0f}); this ahead in {ahead} of {len(base.rates)} rounds, "
              f"mean ratio {ratio:.3f} (95 % interval {low:.3f}–{high:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
