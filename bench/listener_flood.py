"""A slow-body flood on the webhook listener from one address: what it costs the daemon and everyone else.

A real daemon on a throwaway home serves a webhook route to the python3 echo agent. In alternating
windows of ``--window`` seconds, quiet and flooded, this process sends signed webhooks one after the
other from another loopback address (127.0.0.2) and asks ``GET /v1/status`` on the control socket. The
flood is a process of its own holding ``--connections`` connections from 127.0.0.1 that each send a
request head and then one byte of body a second, in two kinds of window: *held* (a connection the
daemon closes stays closed) and *reopened* (each one the daemon closes is opened again at once, the
worst an attacker on the same box can do: a connect loop). Per window: the webhook round trip p50 and the status p50 (with their ratios
flooded/quiet), the daemon's CPU as a share of one core (its audit writer included), its open fds (the
most seen), and how many connections the flood opened a second.

``BENCH_CHECKOUT=/tmp/before`` runs another checkout's daemon on this venv (see daemon_dispatch.py).

    .venv/bin/python bench/listener_flood.py [--window 5] [--rounds 3] [--connections 500] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import psutil  # noqa: E402

from daemon_dispatch import DaemonCPU, start_daemon, stop_and_clean  # noqa: E402
from echo_home import echo_home  # noqa: E402

from covenant.client import DaemonClient  # noqa: E402
from covenant.triggers.webhooks import signature_header  # noqa: E402

SECRET = "bench-secret-" + os.urandom(8).hex()
HEAD = (b"POST /bench HTTP/1.1\r\nHost: covenant\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n"
        b"Covenant-Signature: t=1,v1=" + b"0" * 64 + b"\r\n\r\n")


def flood(port: int, connections: int, reopen: bool) -> None:
    """Hold ``connections`` slow-body connections from 127.0.0.1 until stdin closes, reopening any the server
    closes when ``reopen``; print how many were opened in all (runs in a process of its own)."""
    selector = selectors.DefaultSelector()
    opened = 0

    def open_one() -> None:
        nonlocal opened
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(HEAD)
        except OSError:
            pass  # closed at once: the next select sees it
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        opened += 1

    for _ in range(connections):
        open_one()
    selector.register(sys.stdin, selectors.EVENT_READ)
    next_byte = time.monotonic() + 1
    while True:
        for key, _ in selector.select(timeout=max(0.0, next_byte - time.monotonic())):
            if key.fileobj is sys.stdin:
                print(json.dumps({"opened": opened}), flush=True)
                return
            sock = key.fileobj
            try:
                data = sock.recv(65536)  # type: ignore[union-attr]
            except OSError:
                data = b""
            if not data:  # the server closed it: open another
                selector.unregister(sock)
                sock.close()  # type: ignore[union-attr]
                if reopen:
                    open_one()
        if time.monotonic() >= next_byte:
            next_byte += 1
            for key in list(selector.get_map().values()):
                if key.fileobj is not sys.stdin:
                    try:
                        key.fileobj.send(b"x")  # type: ignore[union-attr]
                    except OSError:
                        pass


def window(port: int, socket_path: Path, cpu: DaemonCPU, daemon: psutil.Process, seconds: float) -> dict[str, float]:
    """Signed webhooks from 127.0.0.2 and status calls, one after the other, for ``seconds``."""
    hooks, statuses, fds = [], [], [daemon.num_fds()]
    cpu_before, started = cpu.seconds(), time.monotonic()
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(transport=transport, timeout=120) as http, DaemonClient(socket_path, timeout=120) as client:
        while time.monotonic() - started < seconds:
            body = f"hello {os.urandom(8).hex()}".encode()  # a fresh signature each time: never a replay
            t0 = time.perf_counter()
            answer = http.post(f"http://127.0.0.1:{port}/bench", content=body,
                               headers={"Covenant-Signature": signature_header(SECRET.encode(), int(time.time()), body)})
            t1 = time.perf_counter()
            client.request("GET", "/v1/status")
            t2 = time.perf_counter()
            if answer.status_code != 200:
                raise SystemExit(f"the webhook was not served: {answer.status_code} {answer.text}")
            hooks.append((t1 - t0) * 1000)
            statuses.append((t2 - t1) * 1000)
            fds.append(daemon.num_fds())
    elapsed = time.monotonic() - started
    return {"hook_ms": statistics.median(hooks), "status_ms": statistics.median(statuses),
            "cpu": (cpu.seconds() - cpu_before) / elapsed, "fds": max(fds), "requests": len(hooks)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=5.0, help="seconds per window")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of windows (quiet, flooded)")
    parser.add_argument("--connections", type=int, default=500, help="connections the flood holds")
    parser.add_argument("--keep", action="store_true", help="keep the temp home (and the daemon log) afterwards")
    parser.add_argument("--flood", nargs=3, type=int, metavar=("PORT", "N", "REOPEN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood:
        flood(args.flood[0], args.flood[1], bool(args.flood[2]))
        return 0

    bench = echo_home("covenant-listener-flood-", {"BENCH_HOOK_SECRET": SECRET})
    daemon = None
    try:
        bench.add_config(f'''
            [webhooks]
            listen = "127.0.0.1:{bench.port}"

            [[webhooks.routes]]
            path = "/bench"
            agent = "echo@local"
            issuer = "bench@local"
            secret_env = "BENCH_HOOK_SECRET"
            rate = "100000/minute"
            ''')
        daemon = start_daemon(bench.env, bench.socket_path, bench.tmp / "daemon.log")
        cpu, process = DaemonCPU(daemon.pid), psutil.Process(daemon.pid)
        window(bench.port, bench.socket_path, cpu, process, 1.0)  # warm-up
        print(f"load {os.getloadavg()[0]:.2f}; {args.rounds} rounds of {args.window:.0f} s windows; flood: "
              f"{args.connections} slow-body connections from 127.0.0.1, held (those closed stay closed) or "
              "reopened (each closed one opened again at once)")
        kinds = ("quiet", "held", "reopened")
        results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for _ in range(args.rounds):
            results["quiet"].append(window(bench.port, bench.socket_path, cpu, process, args.window))
            for kind, reopen in (("held", 0), ("reopened", 1)):
                flooder = subprocess.Popen(
                    [sys.executable, __file__, "--flood", str(bench.port), str(args.connections), str(reopen)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                time.sleep(1.0)  # the flood's connections are open
                t0 = time.monotonic()
                results[kind].append(window(bench.port, bench.socket_path, cpu, process, args.window))
                out, _ = flooder.communicate("", timeout=60)
                results[kind][-1]["opened_per_s"] = json.loads(out)["opened"] / (time.monotonic() - t0 + 1.0)
                time.sleep(1.0)  # the daemon sees the flood's connections close
        for kind in kinds:
            for row in results[kind]:
                extra = f", flood opened {row['opened_per_s']:.0f} connections/s" if "opened_per_s" in row else ""
                print(f"{kind:<8} webhook p50 {row['hook_ms']:.2f} ms, status p50 {row['status_ms']:.2f} ms, "
                      f"daemon CPU {row['cpu'] * 100:.1f} % of a core, fds up to {row['fds']:.0f}, "
                      f"{row['requests']:.0f} requests{extra}")
        quiet = results["quiet"]
        for kind in kinds[1:]:
            flooded = results[kind]
            hook = statistics.median(f["hook_ms"] for f in flooded) / statistics.median(q["hook_ms"] for q in quiet)
            status = statistics.median(f["status_ms"] for f in flooded) / statistics.median(q["status_ms"] for q in quiet)
            print(f"{kind}/quiet: webhook p50 x{hook:.2f}, status p50 x{status:.2f}; daemon CPU "
                  f"{statistics.median(q['cpu'] for q in quiet) * 100:.1f} -> "
                  f"{statistics.median(f['cpu'] for f in flooded) * 100:.1f} % of a core; fds "
                  f"{max(q['fds'] for q in quiet):.0f} -> {max(f['fds'] for f in flooded):.0f}")
    finally:
        stop_and_clean([daemon], bench.tmp, args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
