"""Schedule jitter and webhook overhead, with a real daemon on a throwaway home (issue 15).

1. schedule jitter: a ``[[schedules]] every = "1s"`` schedule fires ``--fires`` times; jitter is the
   ``schedule.fire`` record's audit timestamp minus its slot (the time it was due). Goal p99 <= 50 ms.
2. webhook overhead: interleaved rounds of the same echo intent sent (a) as a signed intent over the
   control socket (DaemonClient, the direct dispatch) and (b) as a signed webhook POST over TCP
   (httpx, HMAC-SHA256); the difference of the medians is what the webhook path adds.

    .venv/bin/python bench/triggers.py [--fires N] [--rounds N] [--keep]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402

from daemon_dispatch import pct, start_daemon, stop_and_clean  # noqa: E402
from echo_home import echo_home  # noqa: E402

from covenant.audit.recent import records_since  # noqa: E402
from covenant.client import DaemonClient  # noqa: E402
from covenant.clock import ms_from_iso  # noqa: E402
from covenant.policy.identities import load_user_identity  # noqa: E402
from covenant.policy.signing import new_intent, sign_intent  # noqa: E402
from covenant.triggers.webhooks import signature_header  # noqa: E402

SECRET = "bench-secret-" + os.urandom(8).hex()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fires", type=int, default=30, help="schedule fires to measure (one per second)")
    parser.add_argument("--rounds", type=int, default=100, help="interleaved direct/webhook dispatch pairs")
    parser.add_argument("--keep", action="store_true", help="keep the temp home afterwards")
    args = parser.parse_args()
    bench = echo_home("covenant-trig-", {"BENCH_HOOK_SECRET": SECRET})
    tmp, home, socket_path, env, port = bench.tmp, bench.home, bench.socket_path, bench.env, bench.port
    daemon = None
    try:
        identity = load_user_identity()
        bench.add_config(f'''
                [webhooks]
                listen = "127.0.0.1:{port}"

                [[webhooks.routes]]
                path = "/bench"
                agent = "echo@local"
                issuer = "bench@local"
                secret_env = "BENCH_HOOK_SECRET"
                rate = "100000/minute"

                [[schedules]]
                name = "jitter"
                agent = "echo@local"
                input = "tick"
                every = "1s"
                issuer = "bench@local"
                ''')
        daemon = start_daemon(env, socket_path, tmp / "daemon.log")

        while True:
            fires = records_since(home / "audit", 0, frozenset({"schedule.fire"}))
            if len(fires) >= args.fires:
                break
            time.sleep(0.5)
        jitter = [ms_from_iso(r["ts"]) - r["data"]["slot_ms"] for r in fires[: args.fires]]

        direct, hook = [], []
        with DaemonClient(socket_path, timeout=60) as client, httpx.Client(timeout=60) as http:
            for i in range(args.rounds + 5):
                intent = new_intent("hello", issuer_display=identity.display, issuer_pubkey=identity.pubkey,
                                    agent="echo@local")
                t0 = time.perf_counter()
                client.request("POST", "/v1/dispatch", {"intent": intent, "signature": sign_intent(identity.key, intent)})
                t1 = time.perf_counter()
                body = f"hello {i}".encode()
                answer = http.post(f"http://127.0.0.1:{port}/bench", content=body,
                                   headers={"Covenant-Signature": signature_header(SECRET.encode(), int(time.time()), body)})
                t2 = time.perf_counter()
                assert answer.status_code == 200, answer.text
                if i >= 5:  # warm-up rounds left out
                    direct.append((t1 - t0) * 1000)
                    hook.append((t2 - t1) * 1000)
        print(f"schedule jitter over {len(jitter)} fires (every 1s): p50 {pct(jitter, 50):.0f} ms, "
              f"p99 {pct(jitter, 99):.0f} ms, max {max(jitter):.0f} ms (goal p99 <= 50 ms)")
        print(f"dispatch of an echo intent, {args.rounds} interleaved rounds: direct (control socket) p50 "
              f"{statistics.median(direct):.2f} ms, webhook (TCP, HMAC) p50 {statistics.median(hook):.2f} ms; "
              f"webhook adds {statistics.median(hook) - statistics.median(direct):.2f} ms "
              f"(ratio {statistics.median(hook) / statistics.median(direct):.2f})")
    finally:
        stop_and_clean([daemon], tmp, args.keep)


if __name__ == "__main__":
    main()
