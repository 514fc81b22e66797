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
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from covenant.audit.recent import records_since  # noqa: E402
from covenant.client import DaemonClient, DaemonUnreachable  # noqa: E402
from covenant.clock import ms_from_iso  # noqa: E402
from covenant.policy.identities import load_user_identity  # noqa: E402
from covenant.policy.signing import new_intent, sign_intent  # noqa: E402
from covenant.triggers.webhooks import signature_header  # noqa: E402

COVENANT = REPO / ".venv" / "bin" / "covenant"
SECRET = "bench-secret-" + os.urandom(8).hex()
ECHO = '''import json, sys
intent = json.loads(sys.stdin.readline())
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": intent["text"], "sources": []}), flush=True)
'''


def cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([str(COVENANT), *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"covenant {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fires", type=int, default=30, help="schedule fires to measure (one per second)")
    parser.add_argument("--rounds", type=int, default=100, help="interleaved direct/webhook dispatch pairs")
    parser.add_argument("--keep", action="store_true", help="keep the temp home afterwards")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="covenant-trig-"))
    os.chmod(tmp, 0o711)
    home, socket_path = tmp / "home", tmp / "covenant.sock"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "COVENANT_HOME": str(home),
           "COVENANT_SOCKET": str(socket_path), "XDG_CONFIG_HOME": str(tmp / "xdg"), "USER": "bench",
           "LANG": "C.UTF-8", "BENCH_HOOK_SECRET": SECRET}
    os.environ.update({k: env[k] for k in ("COVENANT_HOME", "COVENANT_SOCKET", "XDG_CONFIG_HOME")})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    daemon = None
    try:
        cli(env, "init", "--display", "bench@local")
        identity = load_user_identity()
        agent_dir = home / "agents" / "echo"
        agent_dir.mkdir(parents=True)
        (agent_dir / "echo.py").write_text(ECHO)
        os.chmod(agent_dir / "echo.py", 0o644)
        (agent_dir / "agent.toml").write_text(textwrap.dedent('''\
            [agent]
            id = "echo@local"
            name = "echo"
            version = "0.1.0"
            runtime = "python3"
            entry = "echo.py"
            '''))
        with open(home / "covenant.toml", "a") as config:
            config.write(textwrap.dedent(f'''
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
                '''))
        with open(tmp / "daemon.log", "wb") as log:
            daemon = subprocess.Popen([str(COVENANT), "daemon"], env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                DaemonClient(socket_path, timeout=5).request("GET", "/v1/status")
                break
            except DaemonUnreachable:
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise SystemExit((tmp / "daemon.log").read_text())
                time.sleep(0.05)

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
        if daemon is not None and daemon.poll() is None:
            daemon.terminate()
            daemon.wait(timeout=60)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
