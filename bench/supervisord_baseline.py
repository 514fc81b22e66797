"""covenant's dispatch overhead against supervisord's, the same rust-bin echo agent, one run (issue 17).

supervisord (from the package registry, installed into a throwaway venv under the bench's temp dir;
never a dependency of covenant) runs a program that feeds the agent one intent line and waits for it:
``sh -c 'printf LINE | echo-rs'``, ``startsecs=0``, ``autorestart=false``. Interleaved rounds of:

1. raw: ``subprocess.run`` of that same ``sh -c`` (supervisord's baseline) and of the agent with the
   line on stdin (covenant's baseline, as in bench/daemon_dispatch.py);
2. supervisord: XML-RPC ``startProcess(name, wait=True)`` over its unix socket (the call returns once
   the program is RUNNING), then ``getProcessInfo`` until it has EXITED (each poll is one XML-RPC
   round trip, so the figure includes up to one poll of slack);
3. covenant: a signed intent over the control socket to a real daemon (its answer is the outcome, so
   it already includes the run to the end and two durable audit commits).

Overhead = p50 of the path minus p50 of its own raw baseline. Goal: covenant's below supervisord's.

    .venv/bin/python bench/supervisord_baseline.py [--runs N] [--keep]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shlex
import socket
import statistics
import subprocess
import sys
import textwrap
import time
import xmlrpc.client
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_dispatch import (  # noqa: E402
    daemon_once, granted_identity, install_agents, ms, payload, pct, raw_once, start_daemon, stop_and_clean,
    throwaway_home,
)
from covenant.config import RuntimeConfig  # noqa: E402
from covenant.runtime.contract import intent_line  # noqa: E402


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


class _UnixTransport(xmlrpc.client.Transport):
    """XML-RPC over supervisord's unix socket, one kept-alive connection."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path

    def make_connection(self, host: object) -> http.client.HTTPConnection:
        if self._connection[1] is None:
            self._connection = (host, _UnixConnection(self._path))
        return self._connection[1]


def _install_supervisor(tmp: Path) -> Path:
    venv = tmp / "supervisor-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "supervisor"], check=True)
    return venv / "bin" / "supervisord"


def _start_supervisord(binary: Path, tmp: Path, command: str) -> tuple[subprocess.Popen[bytes], xmlrpc.client.ServerProxy]:
    sock = tmp / "supervisor.sock"
    conf = tmp / "supervisord.conf"
    conf.write_text(textwrap.dedent(f"""\
        [unix_http_server]
        file={sock}
        [supervisord]
        logfile={tmp / 'supervisord.log'}
        pidfile={tmp / 'supervisord.pid'}
        nodaemon=true
        [rpcinterface:supervisor]
        supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
        [program:echo]
        command={command.replace('%', '%%')}
        autostart=false
        autorestart=false
        startsecs=0
        stdout_logfile={tmp / 'echo.out'}
        stderr_logfile={tmp / 'echo.err'}
        """))
    process = subprocess.Popen([str(binary), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = xmlrpc.client.ServerProxy("http://localhost", transport=_UnixTransport(str(sock)))
    deadline = time.monotonic() + 30
    while True:
        try:
            proxy.supervisor.getState()
            return process, proxy
        except (OSError, xmlrpc.client.Error):
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("supervisord did not start")
            time.sleep(0.05)


def _supervisord_once(proxy: xmlrpc.client.ServerProxy) -> tuple[float, float]:
    """(s until startProcess returned, s until the program had exited)."""
    t0 = time.perf_counter()
    try:
        proxy.supervisor.startProcess("echo", True)
    except xmlrpc.client.Fault as fault:
        # A program that ends before the wait first looks (a fast agent on an idle box) goes STARTING ->
        # RUNNING -> EXITED at once, and the wait reports that as ABNORMAL_TERMINATION: still a good run.
        if "ABNORMAL_TERMINATION" not in fault.faultString:
            raise
    started = time.perf_counter() - t0
    while (state := proxy.supervisor.getProcessInfo("echo")["statename"]) not in ("EXITED", "STOPPED", "FATAL", "BACKOFF"):
        pass
    took = time.perf_counter() - t0
    if state != "EXITED":
        raise SystemExit(f"supervisord's program ended {state}, not EXITED: see its logs in the temp dir (--keep)")
    return started, took


def _raw_sh_once(command: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(["/bin/sh", "-c", command], stdout=subprocess.DEVNULL, check=True, env=env)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="interleaved rounds")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir afterwards")
    args = parser.parse_args()
    tmp, home, socket_path, env = throwaway_home("covenant-sv-")
    daemon = supervisord = None
    try:
        supervisord_bin = _install_supervisor(tmp)
        identity = granted_identity(env)
        agents = [a for a in install_agents(home, tmp, RuntimeConfig()) if a.runtime == "rust-bin"]
        if not agents:
            raise SystemExit("cargo is needed to build the rust-bin echo agent")
        agent = agents[0]
        line = intent_line(payload(identity)).decode().strip()
        command = f"printf '%s\\n' {shlex.quote(line)} | {shlex.quote(agent.argv[-1])}"
        daemon = start_daemon(env, socket_path, tmp / "daemon.log")
        supervisord, proxy = _start_supervisord(supervisord_bin, tmp, command)

        series: dict[str, list[float]] = {k: [] for k in ("raw", "raw_sh", "sv_start", "sv_exit", "covenant")}
        for round_ in range(args.runs + 5):
            raw = raw_once(agent, identity)
            raw_sh = _raw_sh_once(command, agent.raw_env)
            sv_start, sv_exit = _supervisord_once(proxy)
            covenant = daemon_once(agent, identity, socket_path)[0]
            if round_ >= 5:  # warm-up left out
                for key, value in zip(series, (raw, raw_sh, sv_start, sv_exit, covenant)):
                    series[key].append(value)

        p50 = {k: statistics.median(v) for k, v in series.items()}
        load = os.getloadavg()
        print(f"supervisord vs covenant, rust-bin echo agent, {args.runs} interleaved rounds, "
              f"nproc={os.cpu_count()} load={load[0]:.2f}")
        print("| path | p50 (ms) | p90 (ms) | overhead over its raw baseline, p50 (ms) |")
        print("|---|---:|---:|---:|")
        rows = (("raw: the agent, intent on stdin (covenant's baseline)", "raw", None),
                ("raw: `sh -c 'printf … | echo-rs'` (supervisord's baseline)", "raw_sh", None),
                ("supervisord `startProcess(wait=True)` returns", "sv_start", "raw_sh"),
                ("supervisord, until the program has exited (polled)", "sv_exit", "raw_sh"),
                ("covenant dispatch, answered (run to the end, audited)", "covenant", "raw"))
        for label, key, base in rows:
            extra = f"{(p50[key] - p50[base]) * 1000:+.2f}" if base else "—"
            print(f"| {label} | {ms(p50[key])} | {ms(pct(series[key], 90))} | {extra} |")
        return 0
    finally:
        stop_and_clean([supervisord, daemon], tmp, args.keep)


if __name__ == "__main__":
    sys.exit(main())
