"""What supervising many running agents costs the daemon while they do nothing (issue 17).

A real daemon on a throwaway home with ``[daemon] max_concurrent`` at N: N python3 agents are
dispatched at once, each sleeping longer than the measurement, and once all N are running the
daemon's own CPU time (user + system, its agents excluded) is read over a fixed window. The figure is
that CPU as a share of one core. Goal: N = 100 for <= 5 % of one core.

    .venv/bin/python bench/supervise_idle.py [--agents N] [--window S] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402

from daemon_dispatch import DaemonCPU, start_daemon  # noqa: E402
from echo_home import echo_home  # noqa: E402
from covenant.client import DaemonClient  # noqa: E402

SLEEPER = '''import json, sys, time
intent = json.loads(sys.stdin.readline())
time.sleep(float(intent["text"].split()[-1]))
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": "slept", "sources": []}), flush=True)
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100, help="agents running at once")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of measurement once all run")
    parser.add_argument("--keep", action="store_true", help="keep the temp home afterwards")
    args = parser.parse_args()
    bench = echo_home("covenant-idle-", {})
    bench.add_python_agent("sleeper", SLEEPER)
    bench.extend_section("daemon", f"max_concurrent = {args.agents}\nqueue_max = {args.agents}\n")
    seconds = args.window + 120
    daemon = start_daemon(bench.env, bench.socket_path, bench.tmp / "daemon.log")
    clients: list[subprocess.Popen[bytes]] = []
    try:
        covenant = Path(sys.executable).parent / "covenant"
        for _ in range(args.agents):
            clients.append(subprocess.Popen([str(covenant), "dispatch", f"sleep {seconds}", "--agent", "sleeper@local"],
                                            env=bench.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 120
        with DaemonClient(bench.socket_path, timeout=30) as client:
            while len(client.request("GET", "/v1/status")["in_flight"]) < args.agents:
                if time.monotonic() > deadline:
                    raise SystemExit("not every agent started within 120 s")
                time.sleep(0.5)
        time.sleep(2.0)  # the start-up burst is over
        process = psutil.Process(daemon.pid)
        daemon_cpu = DaemonCPU(daemon.pid)
        before, t0 = daemon_cpu.seconds(), time.monotonic()
        time.sleep(args.window)
        after, elapsed = daemon_cpu.seconds(), time.monotonic() - t0
        cpu = (after - before) / elapsed
        print(f"{args.agents} agents running, {elapsed:.1f} s window: daemon CPU {cpu * 100:.2f} % of one core "
              f"(goal <= 5 % for 100); daemon RSS {process.memory_info().rss / 2**20:.1f} MiB")
        return 0
    finally:
        daemon.terminate()  # its drain cancels the sleepers once the drain timeout passes
        threading.Thread(target=daemon.wait, daemon=True).start()
        try:
            daemon.wait(timeout=120)
        except subprocess.TimeoutExpired:
            daemon.kill()
        for client in clients:
            client.kill()
            client.wait()
        if args.keep:
            print(f"kept {bench.tmp}")
        else:
            shutil.rmtree(bench.tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
