"""What an agent flooding its stderr costs the daemon and everyone else, with and without a budget.

A real daemon on a throwaway home with the echo agent and a flood agent (32-byte lines to stderr as
fast as it can for ``--seconds``, then it answers). Two daemons, one after the other:
"unbounded" (``stderr_log_burst`` and ``stderr_log_lines_per_s`` at 1,000,000, so every line is
logged, as before the budget existed) and "defaults" (1,000 at once, then 100 a second). For each,
in one run: the echo agent's round trip p50 on a quiet daemon (the baseline) and while the flood
runs, the daemon's CPU (its process and its audit writer) over the flood, the bytes its log grew by,
and the bytes the flood agent got to write.

    .venv/bin/python bench/stderr_flood.py [--seconds S] [--keep]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_dispatch import DaemonCPU, start_daemon, stop_and_clean  # noqa: E402
from echo_home import EchoHome, echo_home  # noqa: E402
from covenant.client import DaemonClient  # noqa: E402
from covenant.policy.identities import load_user_identity  # noqa: E402
from covenant.policy.signing import new_intent, sign_intent  # noqa: E402

FLOOD = '''import json, os, sys, time
intent = json.loads(sys.stdin.readline())
block = (b"f" * 31 + b"\\n") * 1024
written = 0
end = time.monotonic() + float(intent["text"])
while time.monotonic() < end:
    written += os.write(2, block)
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": str(written), "sources": []}), flush=True)
'''
BUDGETS = {"unbounded": (1_000_000, 1_000_000), "defaults": (1000, 100)}


def dispatch(socket_path: Path, agent: str, text: str) -> tuple[float, dict]:
    identity = load_user_identity()
    intent = new_intent(text, issuer_display=identity.display, issuer_pubkey=identity.pubkey, agent=agent)
    body = {"intent": intent, "signature": sign_intent(identity.key, intent)}
    start = time.perf_counter()
    with DaemonClient(socket_path, timeout=600) as client:
        outcome = client.request("POST", "/v1/dispatch", body)
    if outcome["outcome"] != "ok":
        raise SystemExit(f"{agent} did not answer ok: {outcome}")
    return time.perf_counter() - start, outcome


def echo_p50(socket_path: Path, until: float | None, count: int) -> float:
    """p50 of sequential echo dispatches: ``count`` of them, or as many as fit before ``until``."""
    times: list[float] = []
    while len(times) < count if until is None else time.monotonic() < until:
        times.append(dispatch(socket_path, "echo@local", "hi")[0])
    return statistics.median(times) * 1000


def measure(bench: EchoHome, seconds: float, keep: bool) -> dict[str, float]:
    log_path = bench.tmp / "daemon.log"
    daemon = start_daemon(bench.env, bench.socket_path, log_path)
    try:
        quiet = echo_p50(bench.socket_path, None, 30)
        cpu = DaemonCPU(daemon.pid)
        log_before, cpu_before = log_path.stat().st_size, cpu.seconds()
        flood = subprocess.Popen([str(Path(sys.executable).parent / "covenant"), "dispatch", str(seconds),
                                  "--agent", "flood@local", "--json"], env=bench.env, stdout=subprocess.PIPE)
        time.sleep(0.5)  # the flood is under way
        during = echo_p50(bench.socket_path, time.monotonic() + seconds - 1.0, 1)
        out, _ = flood.communicate(timeout=seconds + 120)
        cpu_s, log_bytes = cpu.seconds() - cpu_before, log_path.stat().st_size - log_before
        written = int(json.loads(out)["text"])
        return {"quiet": quiet, "during": during, "cpu": cpu_s, "log": log_bytes, "written": written}
    finally:
        stop_and_clean([daemon], bench.tmp, keep)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long the flood agent writes")
    parser.add_argument("--keep", action="store_true", help="keep the temp homes afterwards")
    args = parser.parse_args()
    results = {}
    for name, (burst, rate) in BUDGETS.items():
        bench = echo_home(f"covenant-flood-{name}-", {})
        bench.add_python_agent("flood", FLOOD)
        bench.extend_section("runtime", f"stderr_log_burst = {burst}\nstderr_log_lines_per_s = {rate}\n")
        results[name] = measure(bench, args.seconds, args.keep)
    print(f"flood agent writing stderr for {args.seconds:.0f} s; echo agent dispatched meanwhile")
    print(f"{'budget':<10} {'echo p50 quiet':>15} {'echo p50 flood':>15} {'ratio':>6} {'daemon CPU':>11} "
          f"{'log grew':>10} {'flood wrote':>12}")
    for name, r in results.items():
        print(f"{name:<10} {r['quiet']:>12.1f} ms {r['during']:>12.1f} ms {r['during'] / r['quiet']:>6.2f} "
              f"{r['cpu']:>9.2f} s {r['log'] / 2**20:>7.1f} MB {r['written'] / 2**20:>9.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
