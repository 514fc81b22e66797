"""Rune replicas: cold start to healthy, idle RSS, and 100 concurrent sessions against a 200 ms model.

1. **Cold start**: ``python -I -m covenant.rune.host`` given a replica spec on
   stdin, timed from spawn until ``GET /health`` answers on its socket (no
   daemon: what a replica costs by itself). Baseline in the same run: the same
   interpreter running a bare stdlib unix-socket server that answers the same
   probe (the floor of an interpreter that serves anything at all).
2. **Idle RSS** of that replica once healthy, next to the bare server's.
3. **100 concurrent sessions**: a real daemon on a temp home, one Rune agent
   (``concurrency_limit: 100``) whose provider is the fake model server
   answering every request after 200 ms; 100 signed dispatches at once, each in
   its own session, through the control API, for a few rounds. Baseline: 100
   concurrent requests straight to the same fake (its own limit). The ratio is
   the wall time of a round through covenant over the fake's own, and the
   daemon's CPU per dispatch (``/proc/PID/stat``, its own process only). With
   ``--base PATH`` (another checkout, e.g. ``git worktree add PATH REV``), a
   second daemon of that checkout (its replicas too) runs beside this one's,
   on this venv, and the rounds alternate base, this, direct: before and after
   in one run.

    .venv/bin/python bench/rune_replica.py [--starts N] [--rounds N] [--base PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

_PROBE = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
_BARE = """
import os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(16)
while True:
    c, _ = s.accept(); c.recv(65536)
    c.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\nconnection: close\\r\\n\\r\\n{}"); c.close()
"""


def _probe(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
            s.sendall(_PROBE)
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _start(argv: list[str], sock: Path, stdin: bytes | None) -> tuple[float, subprocess.Popen[bytes]]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    if stdin is not None:
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.flush()
    while not _probe(sock):
        if proc.poll() is not None:
            raise SystemExit(f"{argv} exited {proc.returncode}")
        time.sleep(0.001)
    return time.perf_counter() - t0, proc


def cold_start(starts: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="rune-bench-"))
    replica_ms, bare_ms, replica_rss, bare_rss = [], [], [], []
    try:
        for n in range(starts):
            sock = tmp / f"r{n}.sock"
            spec = {"agent": "bench@local", "socket": str(sock), "gateway": str(tmp / "g.sock"), "gateway_pid": os.getpid(),
                    "health_path": "/health", "system_prompt": "x", "tools": [], "max_steps": 4,
                    "memory_profile": "minimal", "standard_turns": 20, "token_budget": 1000,
                    "checkpoint_policy": "never", "safety_policy": "standard", "skills": {}, "loop": "tools"}
            seconds, proc = _start([sys.executable, "-I", "-m", "covenant.rune.host"], sock,
                                   json.dumps(spec).encode() + b"\n")
            replica_ms.append(seconds * 1000)
            time.sleep(0.2)
            replica_rss.append(_rss_kib(proc.pid))
            proc.kill()
            proc.wait()
            bare_sock = tmp / f"b{n}.sock"
            seconds, proc = _start([sys.executable, "-I", "-c", _BARE, str(bare_sock)], bare_sock, None)
            bare_ms.append(seconds * 1000)
            time.sleep(0.2)
            bare_rss.append(_rss_kib(proc.pid))
            proc.kill()
            proc.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r, b = statistics.median(replica_ms), statistics.median(bare_ms)
    print(f"cold start to healthy, p50 of {starts}: replica {r:.0f} ms, bare stdlib server {b:.0f} ms "
          f"(ratio {r / b:.2f}; max replica {max(replica_ms):.0f} ms; goal <= 300 ms)")
    rr, br = statistics.median(replica_rss) / 1024, statistics.median(bare_rss) / 1024
    print(f"idle RSS: replica {rr:.1f} MB, bare stdlib server {br:.1f} MB (goal <= 30 MB)")


_FAKE = """
import sys
from tests.fakes import model_server
# 100 clients connect at once: the stdlib server's listen backlog of 5 would reset most of them.
model_server._Server.request_queue_size = 1024
sys.argv[1:] = ["--text", "pong", "--delay-s", sys.argv[1]]
model_server.main()
"""


def fake_model(delay_s: float) -> tuple[subprocess.Popen[str], int]:
    """The fake model server answering "pong" after ``delay_s``, in a process of its own: (process, port)."""
    proc = subprocess.Popen([sys.executable, "-c", _FAKE, str(delay_s)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline().strip())


def _fake_round(port: int, concurrency: int) -> float:
    import http.client

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "ping"}]})
    errors: list[BaseException] = []

    def one() -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            response = conn.getresponse()
            response.read()
            conn.close()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"direct request failed: {errors[0]}")
    return time.perf_counter() - t0


class BenchDaemon:
    """A real daemon on a temp home with one Rune agent ``bench`` whose provider is the fake on ``port``."""

    def __init__(self, port: int, *, concurrency: int, warm: int = 0, checkout: Path | None = None,
                 prefix: tuple[str, ...] = (), start_timeout_s: float = 60.0) -> None:
        """``prefix`` goes before the daemon's own argv (e.g. valgrind's, for ``rune_instructions.py``), which
        may then take up to ``start_timeout_s`` to answer."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        from covenant.keys import public_key_hex

        self.base = Path(tempfile.mkdtemp(prefix="rune-bench-"))
        os.chmod(self.base, 0o711)
        home, self.sock = self.base / "home", self.base / "covenant.sock"
        env = {**os.environ, "COVENANT_HOME": str(home), "COVENANT_SOCKET": str(self.sock),
               "XDG_CONFIG_HOME": str(self.base / "xdg")}
        subprocess.run([sys.executable, "-m", "covenant", "init", "--display", "bench@bench"], env=env, check=True,
                       capture_output=True)
        # Agent uids from a range of this run's own: a starting daemon sweeps its whole range (other
        # daemons on a shared box use the default one).
        low = secrets.randbelow(2_000_000_000 - 300_000) + 200_000
        python = f"python = {json.dumps(str(self._replica_python(checkout)))}\n" if checkout else ""
        (home / "covenant.toml").write_text(
            f'[providers.fake]\nkind = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\n\n[daemon]\nqueue_max = 1000\n'
            f'\n[isolation]\nuid_range = [{low}, {low + 9}]\n\n[rune]\nwarm = {warm}\n{python}')
        folder = home / "agents" / "bench"
        folder.mkdir(parents=True)
        (folder / "Runefile").write_text(
            "name: bench\nversion: 0.1.0\ninstructions: answer\ndefault_model: default\nmemory_profile: standard\n"
            f"runtime:\n  concurrency_limit: {concurrency}\n  request_timeout_ms: 60000\n"
            "models:\n  providers: [fake]\n  model_mapping:\n    default: m\n")
        if checkout is not None:
            env["PYTHONPATH"] = str(checkout)
        self.process = subprocess.Popen([*prefix, sys.executable, "-m", "covenant", "daemon"], env=env, cwd=checkout or REPO,
                                        stderr=open(os.environ.get("RUNE_BENCH_LOG", os.devnull), "ab"))
        self.key = Ed25519PrivateKey.generate()
        self.pubkey = public_key_hex(self.key)
        self.env = env
        self._wait_up(start_timeout_s)

    def _replica_python(self, checkout: Path) -> Path:
        """An interpreter for ``[rune] python`` that runs ``checkout``'s replica host: the replica is started
        with ``-I`` (no PYTHONPATH), so this wrapper puts the checkout first on its path itself."""
        wrapper = self.base / "replica-python"
        wrapper.write_text(
            f"#!/bin/sh\nexec {sys.executable} -I -c 'import sys, runpy; sys.path.insert(0, {json.dumps(str(checkout))}); "
            "runpy.run_module(\"covenant.rune.host\", run_name=\"__main__\", alter_sys=True)'\n")
        wrapper.chmod(0o755)
        return wrapper

    def cpu_s(self) -> float:
        """The daemon process's own CPU so far (user + system), not its children's."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _wait_up(self, timeout_s: float) -> None:
        from covenant.client import DaemonClient, DaemonUnreachable

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                DaemonClient(self.sock, timeout=5).request("GET", "/v1/status")
                return
            except DaemonUnreachable:
                if time.monotonic() > deadline:
                    raise SystemExit("daemon did not start")
                time.sleep(0.05)

    def request(self, method: str, path: str, body: object = None) -> object:
        from covenant.client import DaemonClient

        return DaemonClient(self.sock, timeout=120).request(method, path, body)

    def dispatch(self, session: str) -> str:
        """One signed dispatch to bench@local in ``session``: "ok", or the outcome and error."""
        from covenant.policy.signing import new_intent, sign_intent

        intent = new_intent("ping", issuer_display="bench@bench", issuer_pubkey=self.pubkey, agent="bench@local",
                            priority="normal", parent=None)
        body = {"intent": intent, "signature": sign_intent(self.key, intent), "session_id": session}
        outcome = self.request("POST", "/v1/dispatch", body)
        assert isinstance(outcome, dict)
        return "ok" if outcome["outcome"] == "ok" else f"{outcome['outcome']}: {outcome['error']}"

    def replica(self) -> dict:
        status = self.request("GET", "/v1/status")
        assert isinstance(status, dict)
        return status["replicas"][0]

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=120)
        shutil.rmtree(self.base, ignore_errors=True)


def _covenant_round(daemon: BenchDaemon, label: str, concurrency: int) -> float:
    results: list[str] = []

    def one(n: int) -> None:
        results.append(daemon.dispatch(f"{label}-{n}"))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    bad = [r for r in results if r != "ok"]
    if bad or len(results) != concurrency:
        raise SystemExit(f"round {label}: {len(results)} answers, not ok: {bad[:3]}")
    return took


def sessions(rounds: int, concurrency: int, delay_s: float, base: Path | None) -> None:
    fake, port = fake_model(delay_s)
    daemons: dict[str, BenchDaemon] = {}
    try:
        if base is not None:
            daemons["base"] = BenchDaemon(port, concurrency=concurrency, checkout=base)
        # With a base, this checkout's replicas run from this checkout too (not from wherever the venv's
        # editable install points), so both sides run exactly their own commit.
        daemons["this"] = BenchDaemon(port, concurrency=concurrency, checkout=REPO if base is not None else None)
        walls: dict[str, list[float]] = {name: [] for name in daemons}
        cpu: dict[str, float] = dict.fromkeys(daemons, 0.0)
        direct_s = []
        for name, daemon in daemons.items():
            _covenant_round(daemon, f"warm-{name}", concurrency)  # starts the replica
        for n in range(rounds):  # interleaved, so load that comes and goes hits all alike
            for name, daemon in daemons.items():
                before = daemon.cpu_s()
                walls[name].append(_covenant_round(daemon, f"r{n}", concurrency))
                cpu[name] += daemon.cpu_s() - before
            direct_s.append(_fake_round(port, concurrency))
        d = statistics.median(direct_s)
        for name, daemon in daemons.items():
            c = statistics.median(walls[name])
            label = f"{name} ({base})" if name == "base" else name
            print(f"{label}: {concurrency} concurrent sessions, fake answering in {delay_s * 1000:.0f} ms, median of "
                  f"{rounds} rounds: through covenant {c * 1000:.0f} ms, straight to the fake {d * 1000:.0f} ms "
                  f"(ratio {c / d:.2f}; goal <= 1.10); daemon CPU per dispatch "
                  f"{cpu[name] / (rounds * concurrency) * 1000:.2f} ms")
    finally:
        for daemon in daemons.values():
            daemon.close()
        fake.kill()
        fake.wait()


def _bare_start_ms(tmp: Path, n: int) -> float:
    sock = tmp / f"bare{n}.sock"
    seconds, proc = _start([sys.executable, "-I", "-c", _BARE, str(sock)], sock, None)
    proc.kill()
    proc.wait()
    return seconds * 1000


def _first_answer_after_restart_ms(daemon: BenchDaemon, n: int) -> float:
    """``covenant restart`` of the agent (it answers once the old replica is drained and stopped and the new
    one's start has begun), then one dispatch: from the restart's answer to the dispatch's."""
    daemon.request("POST", "/v1/replicas/bench/restart")
    t0 = time.perf_counter()
    outcome = daemon.dispatch(f"after-restart-{n}")
    took = (time.perf_counter() - t0) * 1000
    if outcome != "ok":
        raise SystemExit(f"the dispatch after a restart: {outcome}")
    return took


def _steady_ms(daemon: BenchDaemon, n: int) -> float:
    t0 = time.perf_counter()
    outcome = daemon.dispatch(f"steady-{n}")
    if outcome != "ok":
        raise SystemExit(f"a dispatch to a running replica: {outcome}")
    return (time.perf_counter() - t0) * 1000


def _wait_for_spare(daemon: BenchDaemon) -> None:
    deadline = time.monotonic() + 60
    while daemon.replica().get("spare_pid") is None:
        if time.monotonic() > deadline:
            raise SystemExit("no warm spare appeared")
        time.sleep(0.02)


def restarts(count: int) -> None:
    """The first dispatch after a restart, beyond a dispatch to a running replica, without and with a warm spare;
    against a bare stdlib server's start, all interleaved in one run (fake model answering at once)."""
    fake, port = fake_model(0.0)
    tmp = Path(tempfile.mkdtemp(prefix="rune-bench-"))
    cold = warm = None
    try:
        cold = BenchDaemon(port, concurrency=4, warm=0)
        warm = BenchDaemon(port, concurrency=4, warm=1)
        for daemon in (cold, warm):
            daemon.dispatch("first")
        bare, cold_extra, warm_extra = [], [], []
        for n in range(count):
            bare.append(_bare_start_ms(tmp, n))
            steady = _steady_ms(cold, n)
            cold_extra.append(_first_answer_after_restart_ms(cold, n) - steady)
            _wait_for_spare(warm)
            steady = _steady_ms(warm, n)
            warm_extra.append(_first_answer_after_restart_ms(warm, n) - steady)
        b, c, w = statistics.median(bare), statistics.median(cold_extra), statistics.median(warm_extra)
        print(f"first dispatch after a replica restart, beyond a dispatch to a running one, p50 of {count}: "
              f"cold start {c:.0f} ms (ratio {c / b:.2f} of a bare stdlib server's start, {b:.0f} ms; goal <= 2), "
              f"from the warm spare {w:.0f} ms (goal <= 50 ms; max {max(warm_extra):.0f})")
    finally:
        for daemon in (cold, warm):
            if daemon is not None:
                daemon.close()
        fake.kill()
        fake.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--delay-ms", type=int, default=200)
    parser.add_argument("--restarts", type=int, default=15)
    parser.add_argument("--only", choices=("cold", "restarts", "sessions"), help="run one of the three parts")
    parser.add_argument("--base", type=Path, help="another checkout whose daemon runs the sessions beside this one's")
    args = parser.parse_args()
    if args.only in (None, "cold"):
        cold_start(args.starts)
    if args.only in (None, "restarts"):
        restarts(args.restarts)
    if args.only in (None, "sessions"):
        sessions(args.rounds, args.concurrency, args.delay_ms / 1000, args.base)


if __name__ == "__main__":
    main()
