"""Daemon dispatch latency, throughput and idle RSS against a raw spawn of the same agent.

On a throwaway home (temp dir: `covenant init`, a python3, node and rust-bin
echo agent that each require ``tool.echo``, and a grant of it to the bench
identity), with a real `covenant daemon` process, measures in one run:

1. raw baseline: ``subprocess.run`` of the agent with the same one-line stdin
   (and behind the same pdeathsig wrapper the daemon's record shows in its argv);
2. daemon-side latency: a signed intent POSTed from this process over the unix
   socket (covenant.client.DaemonClient), split into the runner's
   ``record.duration_ms`` and the rest (verify, route, policy, 5 durable audit
   events, dispatch record, HTTP);
3. end to end: a real ``covenant dispatch`` process, what it adds over the
   in-process client, interpreter and CLI start-up for context, and an
   ``-X importtime`` check that the dispatch path imports none of trio,
   pydantic, psutil, yaml;
4. throughput at concurrency 1, 8, 16 and 64 (threads), daemon vs raw;
5. the daemon's RSS after start-up and after the benchmark.

The sequential measurements are interleaved (raw, raw behind the wrapper, daemon, CLI and
`python -c pass` in each round) so that load drift on a shared box hits all five alike; the CLI's
ratio to `python -c pass` (issue 38's goal: at most 3x) comes from the same rounds.

Targets (issue 6): daemon-side overhead < 1 ms p50 over the raw spawn; the
`covenant dispatch` process adds < 80 ms; idle RSS < 60 MB.

    .venv/bin/python bench/daemon_dispatch.py [--runs N] [--max-concurrent N] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from covenant.client import DaemonClient, DaemonUnreachable  # noqa: E402
from covenant.config import RuntimeConfig, default_python3  # noqa: E402
from covenant.policy.identities import UserIdentity, load_user_identity  # noqa: E402
from covenant.policy.signing import new_intent, sign_intent  # noqa: E402
from covenant.runtime.contract import intent_line  # noqa: E402
from echo_agents import AGENTS, build_rust  # noqa: E402

VENV_BIN = REPO / ".venv" / "bin"
COVENANT = VENV_BIN / "covenant"
CONCURRENCY = (1, 8, 16, 64)  # 16: issue 17's throughput goal (>= 600/s, or 90 % of raw)
FORBIDDEN = ("trio", "pydantic", "psutil", "yaml")
ALSO_WATCHED = ("httpx", "tomlkit", "rich", "hypercorn", "h11", "dataclasses")
ACTION = "tool.echo"
TEXT = "hello from the bench"


# -- statistics -------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


# -- the throwaway home -----------------------------------------------------------------------


@dataclass
class Agent:
    runtime: str
    agent_id: str
    root: Path
    argv: list[str]
    raw_env: dict[str, str]
    seq: dict[str, list[float]] = field(default_factory=dict)
    durations_ms: list[int] = field(default_factory=list)
    cli_cpu: list[float] = field(default_factory=list)
    daemon_cpu_per_dispatch: float = 0.0
    throughput: dict[str, dict[int, float]] = field(default_factory=dict)


def manifest(agent_id: str, runtime: str, entry: str) -> str:
    return textwrap.dedent(f"""\
        [agent]
        id = "{agent_id}"
        name = "{agent_id.split('@')[0]}"
        version = "0.1.0"
        runtime = "{runtime}"
        entry = "{entry}"

        [capabilities]
        required = ["{ACTION}"]
        """)



def install_agents(home: Path, tmp: Path, config: RuntimeConfig) -> list[Agent]:
    """The echo agents as <home>/agents/<name>/, with the argv a raw spawn of each uses."""
    scratch = tmp / "raw-scratch"
    scratch.mkdir()
    raw_env = {"PATH": config.path, "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8", "TZ": "UTC"}
    sources: list[tuple[str, Path, list[str]]] = [("python3", AGENTS / "echo.py", [default_python3()])]
    node = shutil.which("node", path=config.path)
    if node is not None:
        sources.append(("node", AGENTS / "echo.js", [node]))
    rust = build_rust(tmp / "target")
    if rust is not None:
        sources.append(("rust-bin", rust, []))
    agents = []
    for runtime, source, interpreter in sources:
        name = f"echo-{runtime.split('-')[0]}"
        root = home / "agents" / name
        root.mkdir(parents=True)
        entry = root / source.name
        shutil.copy2(source, entry)
        (root / "agent.toml").write_text(manifest(f"{name}@bench", runtime, source.name))
        agents.append(Agent(runtime, f"{name}@bench", root, [*interpreter, str(entry)], raw_env))
    return agents


def covenant_cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([str(COVENANT), *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"covenant {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def granted_identity(env: dict[str, str]) -> UserIdentity:
    """``covenant init`` of the throwaway home as bench@local, granted the echo agents' action."""
    covenant_cli(env, "init", "--display", "bench@local")
    identity = load_user_identity()
    covenant_cli(env, "grant", identity.pubkey, ACTION)
    return identity


def checkout_env() -> dict[str, str]:
    """``PYTHONPATH`` for covenant's processes when ``BENCH_CHECKOUT`` names another checkout.

    For before/after tables from one run: ``BENCH_CHECKOUT=/tmp/before .venv/bin/python bench/X.py``
    runs the daemon and the CLI of that checkout (a ``git worktree`` of the old commit) on this venv.
    """
    other = os.environ.get("BENCH_CHECKOUT")
    return {"PYTHONPATH": other} if other else {}


class Throwaway(NamedTuple):
    tmp: Path
    home: Path
    socket_path: Path
    env: dict[str, str]


def throwaway_home(prefix: str, extra_env: dict[str, str] | None = None) -> Throwaway:
    """A 0711 temp dir for a home (not initialised) and the env covenant's processes get; this process's
    env points at it too (the in-process client and ``load_user_identity`` read it)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(tmp, 0o711)  # a root daemon runs agents as other uids: they must traverse to their package
    home, socket_path = tmp / "home", tmp / "covenant.sock"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "COVENANT_HOME": str(home),
           "COVENANT_SOCKET": str(socket_path), "XDG_CONFIG_HOME": str(tmp / "xdg"), "USER": "bench",
           "LANG": "C.UTF-8", **checkout_env(), **(extra_env or {})}
    throwaway = Throwaway(tmp, home, socket_path, env)
    use_home(throwaway)
    return throwaway


def use_home(throwaway: Throwaway) -> None:
    """Point this process's env at ``throwaway``'s home (the in-process client and ``load_user_identity``
    read it)."""
    os.environ.update({k: throwaway.env[k] for k in ("COVENANT_HOME", "COVENANT_SOCKET", "XDG_CONFIG_HOME")})


def stop_and_clean(processes: list[subprocess.Popen[bytes] | None], tmp: Path, keep: bool = False) -> None:
    """Stop what is still running (SIGTERM, then SIGKILL after 60 s) and remove the throwaway dir unless ``keep``."""
    for process in processes:
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    if keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def start_daemon(env: dict[str, str], socket_path: Path, log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(COVENANT), "daemon"], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the daemon exited {process.returncode}:\n{log_path.read_text()}")
        try:
            with DaemonClient(socket_path, timeout=5) as client:
                client.request("GET", "/v1/status")
            return process
        except DaemonUnreachable:
            time.sleep(0.05)
    process.kill()
    raise SystemExit(f"the daemon did not answer within 60 s:\n{log_path.read_text()}")


class DaemonCPU:
    """The CPU the daemon spends: its own process and its audit writer process, never its agents.

    The writer (``covenant.audit.writer_process``) does the daemon's hashing, signing and syncing in a
    process of its own; a figure without it would flatter the daemon. A daemon without one (an older
    checkout) is measured alone.
    """

    def __init__(self, pid: int) -> None:
        self.daemon = psutil.Process(pid)
        self.writer = next(
            (child for child in self.daemon.children() if "covenant.audit.writer_process" in child.cmdline()), None
        )

    def seconds(self) -> float:
        total = 0.0
        for process in (self.daemon, self.writer):
            if process is not None:
                times = process.cpu_times()
                total += times.user + times.system
        return total


# -- one measurement of each kind -------------------------------------------------------------


def payload(identity: UserIdentity) -> dict[str, object]:
    """What the daemon writes to the agent's stdin, minus nothing: same shape and size."""
    return {"id": str(uuid.uuid4()), "text": TEXT, "issuer": {"display": identity.display, "pubkey": identity.pubkey},
            "issued_at": int(time.time() * 1000), "priority": "normal", "parent": None}


def raw_once(agent: Agent, identity: UserIdentity, wrapper: tuple[str, ...] = ()) -> float:
    line = intent_line(payload(identity))
    start = time.perf_counter()
    done = subprocess.run([*wrapper, *agent.argv], input=line, capture_output=True, cwd=agent.root, env=agent.raw_env)
    elapsed = time.perf_counter() - start
    if done.returncode != 0 or json.loads(done.stdout)["text"] != TEXT:
        raise SystemExit(f"raw {agent.runtime} failed: {done}")
    return elapsed


def signed_body(agent: Agent, identity: UserIdentity) -> dict[str, object]:
    intent = new_intent(TEXT, issuer_display=identity.display, issuer_pubkey=identity.pubkey, agent=agent.agent_id)
    return {"intent": intent, "signature": sign_intent(identity.key, intent)}


def daemon_once(agent: Agent, identity: UserIdentity, socket_path: Path) -> tuple[float, int, list[str]]:
    """(HTTP round trip in s, the runner's record.duration_ms, its argv); signing is outside the timing."""
    body = signed_body(agent, identity)
    start = time.perf_counter()
    with DaemonClient(socket_path, timeout=600) as client:
        outcome = client.request("POST", "/v1/dispatch", body)
    elapsed = time.perf_counter() - start
    if outcome["outcome"] != "ok" or outcome["text"] != TEXT or outcome["intent_id"] != body["intent"]["id"]:  # type: ignore[index]
        raise SystemExit(f"daemon dispatch to {agent.agent_id} failed: {outcome}")
    return elapsed, int(outcome["record"]["duration_ms"]), list(outcome["record"]["argv"])


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_process(argv: list[str], env: dict[str, str], cpu: list[float] | None = None) -> float:
    """Wall time of one child process; its CPU time (user+sys) goes to ``cpu``.

    Children run one at a time here, so the RUSAGE_CHILDREN delta is this child's.
    CPU time barely moves with the load other users put on the box; wall time does.
    """
    before = children_cpu()
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    if cpu is not None:
        cpu.append(children_cpu() - before)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
    return elapsed


def cli_once(agent: Agent, env: dict[str, str], cpu: list[float] | None = None) -> float:
    return timed_process([str(COVENANT), "dispatch", "--agent", agent.agent_id, TEXT], env, cpu)


def throughput(fn: Callable[[], object], concurrency: int, count: int) -> float:
    """Calls of ``fn`` per second with ``concurrency`` threads each calling it in turn."""
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: fn(), range(count)))
    return count / (time.perf_counter() - start)


# -- the import check -------------------------------------------------------------------------


def import_check(env: dict[str, str], agent: Agent) -> tuple[list[str], list[str], float, int]:
    """Run a real `covenant dispatch` under -X importtime.

    Returns (forbidden modules imported, other watched modules imported, total import
    time in ms, number of modules imported).
    """
    done = subprocess.run([str(VENV_BIN / "python"), "-X", "importtime", str(COVENANT), "dispatch",
                           "--agent", agent.agent_id, TEXT], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"covenant dispatch under -X importtime exited {done.returncode}: {done.stderr[-2000:]}")
    names: set[str] = set()
    total_us = 0
    count = 0
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self_us, cumulative_us, name = line[len("import time:"):].split("|")
        count += 1
        module = name.strip()
        names.add(module.split(".")[0])
        if name.startswith(" ") and not name.startswith("  "):  # top level: its cumulative holds its children
            total_us += int(cumulative_us)
    forbidden = sorted(n for n in FORBIDDEN if n in names)
    watched = sorted(n for n in ALSO_WATCHED if n in names)
    return forbidden, watched, total_us / 1000, count


# -- the run ----------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30,
                        help="sequential rounds per agent (throughput: max(2*runs, 2*concurrency) dispatches)")
    parser.add_argument("--max-concurrent", type=int, default=None,
                        help="set [daemon] max_concurrent (default: the daemon's default, CPUs x 4)")
    parser.add_argument("--keep", action="store_true", help="keep the temp home (and the daemon log) afterwards")
    args = parser.parse_args()

    tmp, home, socket_path, env = throwaway_home("covenant-dd-")
    daemon: subprocess.Popen[bytes] | None = None
    try:
        identity = granted_identity(env)
        if args.max_concurrent is not None:
            config = home / "covenant.toml"
            config.write_text(config.read_text().replace("[daemon]\n", f"[daemon]\nmax_concurrent = {args.max_concurrent}\n", 1))
        runtime_config = RuntimeConfig()
        agents = install_agents(home, tmp, runtime_config)
        daemon = start_daemon(env, socket_path, tmp / "daemon.log")
        time.sleep(1.0)
        rss_start = rss_mib(daemon.pid)
        status = DaemonClient(socket_path).request("GET", "/v1/status")
        max_concurrent = status.get("limits", {}).get("max_concurrent", "?")

        load = os.getloadavg()
        print(f"covenant daemon bench  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  nproc={os.cpu_count()}  "
              f"load={load[0]:.2f},{load[1]:.2f},{load[2]:.2f}  runs={args.runs}  max_concurrent={max_concurrent}")
        print(f"agents: {', '.join(a.runtime for a in agents)}  (python3 = {default_python3()})")
        print(f"daemon pid {daemon.pid}, RSS after start-up {rss_start:.1f} MiB")

        # 1-3: sequential, interleaved.
        for agent in agents:
            series: dict[str, list[float]] = {"raw": [], "wrapped": [], "daemon": [], "cli": [], "pass": []}
            for _ in range(3):  # warm-up: page cache, the daemon's first-dispatch paths
                raw_once(agent, identity)
                argv = daemon_once(agent, identity, socket_path)[2]
                cli_once(agent, env)
            # The same wrapper the daemon puts before the agent's argv (a pdeathsig helper), if any.
            wrapper = tuple(argv[: len(argv) - len(agent.argv)]) if argv[-len(agent.argv):] == agent.argv else ()
            print(f"{agent.runtime:<9} daemon argv: {' '.join(argv)}")
            if wrapper:
                try:
                    raw_once(agent, identity, wrapper)
                except SystemExit:  # e.g. a helper only the daemon may run (an fd of its own)
                    print(f"{agent.runtime:<9} the daemon's wrapper cannot run from here; no wrapped baseline")
                    wrapper = ()
            daemon_cpu = DaemonCPU(daemon.pid)
            cpu_before = daemon_cpu.seconds()
            for _ in range(args.runs):
                series["raw"].append(raw_once(agent, identity))
                if wrapper:
                    series["wrapped"].append(raw_once(agent, identity, wrapper))
                elapsed, duration_ms, _ = daemon_once(agent, identity, socket_path)
                series["daemon"].append(elapsed)
                agent.durations_ms.append(duration_ms)
                series["cli"].append(cli_once(agent, env, agent.cli_cpu))
                series["pass"].append(timed_process([str(VENV_BIN / "python"), "-c", "pass"], env))
            # Two dispatches per round (in-process and CLI); the daemon's own CPU, not its agents'.
            agent.daemon_cpu_per_dispatch = (daemon_cpu.seconds() - cpu_before) / (2 * args.runs)
            agent.seq = series
            raw, dmn, cli = (statistics.median(series[k]) for k in ("raw", "daemon", "cli"))
            print(f"{agent.runtime:<9} raw p50 {ms(raw)} ms  daemon p50 {ms(dmn)} ms (+{ms(dmn - raw)} ms, "
                  f"{dmn / raw:.3f}x)  CLI p50 {ms(cli)} ms (+{ms(cli - dmn)} ms over in-process)")

        context_runs = max(10, args.runs // 2)
        context: dict[str, tuple[float, float]] = {}
        for label, argv in (("`.venv/bin/python -c pass`", [str(VENV_BIN / "python"), "-c", "pass"]),
                            ("`.venv/bin/python -S -c pass`", [str(VENV_BIN / "python"), "-S", "-c", "pass"]),
                            ("`covenant --version`", [str(COVENANT), "--version"])):
            cpu: list[float] = []
            wall = statistics.median(timed_process(argv, env, cpu) for _ in range(context_runs))
            context[label] = (wall, statistics.median(cpu))
        forbidden, watched, import_ms, module_count = import_check(env, agents[0])

        # 4: throughput.
        for agent in agents:
            agent.throughput = {"raw": {}, "daemon": {}}
            for concurrency in CONCURRENCY:
                count = max(2 * args.runs, 2 * concurrency)
                agent.throughput["raw"][concurrency] = throughput(lambda: raw_once(agent, identity), concurrency, count)
                agent.throughput["daemon"][concurrency] = throughput(
                    lambda: daemon_once(agent, identity, socket_path), concurrency, count)
            print(f"{agent.runtime:<9} throughput " + "  ".join(
                f"c{c}: raw {agent.throughput['raw'][c]:.1f}/s daemon {agent.throughput['daemon'][c]:.1f}/s"
                for c in CONCURRENCY))

        # 5: idle RSS after the benchmark.
        time.sleep(2.0)
        rss_after = rss_mib(daemon.pid)
        load_end = os.getloadavg()

        report(agents, context, forbidden, watched, import_ms, module_count,
               rss_start, rss_after, load_end)
        return 0
    finally:
        stop_and_clean([daemon], tmp, args.keep)


def report(agents: list[Agent], context: dict[str, tuple[float, float]],
           forbidden: list[str], watched: list[str], import_ms: float, module_count: int,
           rss_start: float, rss_after: float, load_end: tuple[float, float, float]) -> None:
    """The summary as a markdown table, ready to paste into docs/performance.md."""
    head = "| measure | " + " | ".join(a.runtime for a in agents) + " | target |"
    rows = [head, "|---|" + "---:|" * len(agents) + "---|"]

    def row(label: str, cell: Callable[[Agent], str], target: str = "") -> None:
        rows.append(f"| {label} | " + " | ".join(cell(a) for a in agents) + f" | {target} |")

    def p(key: str, q: float) -> Callable[[Agent], str]:
        return lambda a: ms(pct(a.seq[key], q))

    overhead_met: list[bool] = []

    def overhead(a: Agent) -> str:
        delta = statistics.median(a.seq["daemon"]) - statistics.median(a.seq["raw"])
        overhead_met.append(delta < 0.001)
        return f"{ms(delta)} ({statistics.median(a.seq['daemon']) / statistics.median(a.seq['raw']):.2f}x)"

    def outside_runner(a: Agent) -> str:
        return ms(statistics.median(a.seq["daemon"]) - statistics.median(a.durations_ms) / 1000)

    cli_met: list[bool] = []

    def cli_adds(a: Agent) -> str:
        delta = statistics.median(a.seq["cli"]) - statistics.median(a.seq["daemon"])
        cli_met.append(delta < 0.080)
        return ms(delta)

    row("raw spawn p50 / p95 (ms)", lambda a: f"{ms(pct(a.seq['raw'], 50))} / {ms(pct(a.seq['raw'], 95))}")
    if all(a.seq["wrapped"] for a in agents):
        row("raw spawn behind the daemon's wrapper (see argv above), p50 (ms)", p("wrapped", 50))
    row("daemon round trip, in-process client, p50 / p95 (ms)",
        lambda a: f"{ms(pct(a.seq['daemon'], 50))} / {ms(pct(a.seq['daemon'], 95))}")
    row("**daemon-side overhead p50** (ms, ratio)", overhead, "< 1 ms")
    row("  of which: runner `record.duration_ms` p50 (ms, truncated to whole ms)",
        lambda a: f"{statistics.median(a.durations_ms):.1f}")
    row("  of which: outside the runner, p50 round trip − p50 duration_ms (ms)", outside_runner)
    row("daemon process CPU per dispatch, mean (ms; its agents' CPU excluded)", lambda a: ms(a.daemon_cpu_per_dispatch))
    row("`covenant dispatch` CLI p50 / p95 (ms)", lambda a: f"{ms(pct(a.seq['cli'], 50))} / {ms(pct(a.seq['cli'], 95))}")
    row("**CLI adds over in-process client, p50** (ms)", cli_adds, "< 80 ms")
    row("CLI process CPU (user+sys, its agent excluded) p50 (ms)", lambda a: ms(statistics.median(a.cli_cpu)))
    row("`python -c pass` in the same rounds p50 (ms)", p("pass", 50))
    row("**CLI p50 over `python -c pass` p50, same rounds**",
        lambda a: f"{statistics.median(a.seq['cli']) / statistics.median(a.seq['pass']):.2f}x", "≤ 3x (issue 38)")
    for c in CONCURRENCY:
        row(f"throughput c={c}: raw / daemon (/s, ratio)",
            lambda a, c=c: f"{a.throughput['raw'][c]:.1f} / {a.throughput['daemon'][c]:.1f} "
                           f"({a.throughput['daemon'][c] / a.throughput['raw'][c]:.2f})")
    print()
    print("\n".join(rows))
    print()
    print("| context | value | target |")
    print("|---|---:|---|")
    for label, (wall, cpu) in context.items():
        print(f"| {label} p50 wall / CPU | {ms(wall)} / {ms(cpu)} ms | |")
    print(f"| `covenant dispatch` imports (-X importtime) | {module_count} modules, {import_ms:.1f} ms | |")
    verdict = "none (OK)" if not forbidden else "IMPORTED: " + ", ".join(forbidden)
    print(f"| dispatch path imports trio/pydantic/psutil/yaml | {verdict} | none |")
    print(f"| dispatch path imports httpx/tomlkit/rich/hypercorn/h11/dataclasses | {', '.join(watched) or 'none'} | |")
    print(f"| daemon RSS after start-up | {rss_start * 1.048576:.1f} MB ({rss_start:.1f} MiB) | < 60 MB |")
    print(f"| daemon RSS idle after the bench | {rss_after * 1.048576:.1f} MB ({rss_after:.1f} MiB) | < 60 MB |")
    print()
    print("verdicts: "
          f"daemon-side overhead < 1 ms p50: {'met' if overhead_met and all(overhead_met) else 'NOT met'}; "
          f"CLI adds < 80 ms: {'met' if cli_met and all(cli_met) else 'NOT met'}; "
          f"no trio/pydantic/psutil/yaml on the dispatch path: {'met' if not forbidden else 'NOT met'}; "
          f"idle RSS < 60 MB: {'met' if max(rss_start, rss_after) * 2**20 < 60e6 else 'NOT met'}")
    print(f"load average at the end: {load_end[0]:.2f}, {load_end[1]:.2f}, {load_end[2]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
