"""A connection flood on a Rune replica's gateway socket: what it costs the daemon and other agents.

A real daemon on a throwaway home serves a Rune agent (on the fake model server) and the rust-bin
echo agent. Once the replica runs, the echo agent is dispatched one intent after the other, in
alternating windows of ``--window`` seconds: quiet, and while a process connects to the replica's
gateway socket in a loop (connect, read to the end, close), as a hostile tool of the agent can: the
bench runs that tool, ``tests/security/agents/replica_flood.py``, itself. The gateway serves the replica's pid only, so every such connection is refused. Per window: the
echo round trip p50, the daemon's CPU as a share of one core (its audit writer included), and how many
connections the flood made and how many got an answer (a 403) rather than a close.

``BENCH_CHECKOUT=/tmp/before`` runs another checkout's daemon on this venv (see daemon_dispatch.py).

    .venv/bin/python bench/gateway_flood.py [--window 3] [--rounds 4] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_dispatch import (  # noqa: E402
    DaemonCPU, daemon_once, granted_identity, install_agents, start_daemon, stop_and_clean, throwaway_home,
)
from rune_replica import fake_model  # noqa: E402
from covenant.client import DaemonClient  # noqa: E402
from covenant.config import RuntimeConfig  # noqa: E402
from covenant.policy.signing import new_intent, sign_intent  # noqa: E402

# The hostile tool of tests/security, run here by the bench itself: the gateway refuses any pid but
# its replica's, root's as well as the agent uid's.
FLOODER = Path(__file__).resolve().parent.parent / "tests" / "security" / "agents" / "replica_flood.py"

RUNEFILE = """\
name: flooded
version: 0.1.0
instructions: answer
default_model: default
models:
  providers: [fake]
  model_mapping:
    default: m
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=3.0, help="seconds per window")
    parser.add_argument("--rounds", type=int, default=4, help="pairs of windows (quiet, flooded)")
    parser.add_argument("--keep", action="store_true", help="keep the temp home (and the daemon log) afterwards")
    args = parser.parse_args()

    fake, port = fake_model(0.0)
    home = throwaway_home("covenant-flood-")
    daemon = None
    try:
        identity = granted_identity(home.env)
        low = secrets.randbelow(2_000_000_000 - 300_000) + 200_000  # a uid range of this run's own
        config = home.home / "covenant.toml"
        text = config.read_text().replace("[isolation]", f"[isolation]\nuid_range = [{low}, {low + 9}]", 1)
        config.write_text(f'{text}\n[providers.fake]\nkind = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\n')
        (home.home / "agents" / "flooded").mkdir(parents=True)
        (home.home / "agents" / "flooded" / "Runefile").write_text(RUNEFILE)
        echo = next(a for a in install_agents(home.home, home.tmp, RuntimeConfig()) if a.runtime == "rust-bin")
        daemon = start_daemon(home.env, home.socket_path, home.tmp / "daemon.log")
        for _ in range(20):
            daemon_once(echo, identity, home.socket_path)
        intent = new_intent("ping", issuer_display=identity.display, issuer_pubkey=identity.pubkey, agent="flooded@local")
        answer = DaemonClient(home.socket_path, timeout=120).request(
            "POST", "/v1/dispatch", {"intent": intent, "signature": sign_intent(identity.key, intent)})
        if answer["outcome"] != "ok":  # the replica runs now, its gateway socket with it
            raise SystemExit(f"the Rune agent did not answer: {answer}")
        gateway = home.home / "state" / "replicas" / "flooded@local" / "gateway.sock"
        cpu = DaemonCPU(daemon.pid)
        results: dict[str, list[tuple[float, float, int, int]]] = {"quiet": [], "flooded": []}
        for _ in range(args.rounds):
            for kind in ("quiet", "flooded"):
                flooder = None
                if kind == "flooded":
                    flooder = subprocess.Popen([sys.executable, str(FLOODER)], stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, text=True)
                    assert flooder.stdin is not None
                    flooder.stdin.write(json.dumps({"folder": str(gateway.parent), "seconds": args.window}))
                    flooder.stdin.close()
                    time.sleep(0.2)  # the flood under way before the window opens
                cpu0, t0, latencies = cpu.seconds(), time.monotonic(), []
                while time.monotonic() - t0 < args.window - 0.3:
                    latencies.append(daemon_once(echo, identity, home.socket_path)[0])
                share = (cpu.seconds() - cpu0) / (time.monotonic() - t0)
                made, answered = 0, 0
                if flooder is not None:
                    assert flooder.stdout is not None
                    counted = json.loads(flooder.stdout.read())
                    flooder.wait()
                    made, answered = counted["connections"], counted["answered"]
                results[kind].append((statistics.median(latencies) * 1000, share * 100, made, answered))
        print(f"gateway flood, {args.rounds} rounds of {args.window:.0f} s windows; load {os.getloadavg()[0]:.2f}")
        print("| window | echo p50 (ms) | daemon, % of a core | flood connections per s | of them answered |")
        print("|---|---:|---:|---:|---:|")
        for kind, rows in results.items():
            p50, share, made, answered = (statistics.median(column) for column in zip(*rows))
            flood_columns = f"{made / args.window:.0f} | {answered:.0f}" if kind == "flooded" else "— | —"
            print(f"| {kind} | {p50:.2f} | {share:.0f} | {flood_columns} |")
    finally:
        stop_and_clean([daemon], home.tmp, args.keep)
        fake.kill()
        fake.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
