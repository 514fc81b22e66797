"""What serving an agent over A2A adds to a dispatch, with a real daemon on a throwaway home (issue 19).

Interleaved rounds of the same echo agent reached (a) as a signed intent over the control socket
(DaemonClient: the direct dispatch) and (b) as an A2A 1.0 ``SendMessage`` JSON-RPC request with a
bearer token over TCP (httpx, keep-alive). The difference of the medians is what the A2A path adds:
HTTP over TCP, the token check, the daemon's signing on the client's behalf, the task mapping and the
``a2a.request`` audit event (one more durable record). Goal: <= 2 ms p50 added.

    .venv/bin/python bench/a2a_overhead.py [--rounds N] [--keep]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402

from daemon_dispatch import pct, start_daemon, stop_and_clean  # noqa: E402
from echo_home import echo_home  # noqa: E402
from covenant.client import DaemonClient  # noqa: E402
from covenant.policy.identities import load_user_identity  # noqa: E402
from covenant.policy.signing import new_intent, sign_intent  # noqa: E402

TOKEN = "bench-" + secrets.token_hex(16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="interleaved direct/A2A dispatch pairs")
    parser.add_argument("--keep", action="store_true", help="keep the temp home afterwards")
    args = parser.parse_args()
    bench = echo_home("covenant-a2a-", {"BENCH_A2A_TOKEN": TOKEN})
    tmp, socket_path, env, port = bench.tmp, bench.socket_path, bench.env, bench.port
    daemon = None
    try:
        identity = load_user_identity()
        bench.add_config(f'''
                [a2a]
                listen = "127.0.0.1:{port}"
                expose = ["echo"]

                [[a2a.clients]]
                name = "bench"
                token_env = "BENCH_A2A_TOKEN"
                issuer = "bench@local"
                rate = "100000/minute"
                ''')
        daemon = start_daemon(env, socket_path, tmp / "daemon.log")

        direct, a2a = [], []
        url = f"http://127.0.0.1:{port}/a2a/echo"
        headers = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}
        with DaemonClient(socket_path, timeout=60) as client, httpx.Client(timeout=60, headers=headers) as http:
            for i in range(args.rounds + 5):
                intent = new_intent("hello", issuer_display=identity.display, issuer_pubkey=identity.pubkey,
                                    agent="echo@local")
                t0 = time.perf_counter()
                client.request("POST", "/v1/dispatch", {"intent": intent, "signature": sign_intent(identity.key, intent)})
                t1 = time.perf_counter()
                answer = http.post(url, json={"jsonrpc": "2.0", "id": i, "method": "SendMessage", "params": {
                    "message": {"messageId": f"m{i}", "role": "ROLE_USER", "parts": [{"text": "hello"}]}}})
                t2 = time.perf_counter()
                state = answer.json()["result"]["task"]["status"]["state"]
                assert state == "TASK_STATE_COMPLETED", answer.text
                if i >= 5:  # warm-up rounds are left out
                    direct.append((t1 - t0) * 1000)
                    a2a.append((t2 - t1) * 1000)
        added = statistics.median(a2a) - statistics.median(direct)
        print(f"A2A SendMessage vs direct dispatch, {args.rounds} interleaved rounds, python3 echo agent")
        print(f"  direct (control socket)   p50 {pct(direct, 50):7.2f} ms   p90 {pct(direct, 90):7.2f} ms")
        print(f"  A2A (TCP, bearer, JSON-RPC) p50 {pct(a2a, 50):7.2f} ms   p90 {pct(a2a, 90):7.2f} ms")
        print(f"  added by A2A (median difference): {added:+.2f} ms   (goal <= 2 ms)")
    finally:
        stop_and_clean([daemon], tmp, args.keep)


if __name__ == "__main__":
    main()
