"""The fleet's figures (issue 36), in one run: a real 3-node NATS cluster (JetStream, R3) on loopback and
three root daemons with their `covenant fleet` processes, as tests/fleet builds them.

1. **Added latency.** The python3 echo agent on host 1 only, dispatched by a warm in-process client
   straight to its daemon (``DaemonClient``, what ``covenant dispatch`` does after its start-up) and over
   the fleet (``FleetClient.dispatch``: publish, the fleet process pulls, records ``fleet.delivery``,
   dispatches, publishes the answer), alternating one and one; p50 and p90 of each and the difference.
   Then the same two as whole CLI processes (``covenant dispatch`` against ``--fleet``).
2. **Throughput, 3 hosts against 1.** An agent that sleeps 200 ms, per-host capacity 4
   (``max_in_flight``), on host 1 only and then on all three: ``--intents`` at once, intents/s, the ratio.
   Twice: the python3 test agent (``tests/daemon/agents/slow.py``: ~40 ms of CPU to start, on 2 cores
   shared by three hosts), and a compiled one (C, built here with ``cc``, run as a rust-bin agent) whose
   start costs almost nothing, so the figure is the fleet's and the daemons', not the interpreter's.
3. **Failover.** An intent running on one host whose daemon and fleet process get kill -9: time from the
   kill to the answer of its re-run on another host, against ``ack_wait_s``.
4. **A dead host's agents.** kill -9 of the only host that runs an agent: time until ``dispatch
   --fleet`` says no live host runs it (the host entry's 15 s TTL), the figure the tests do not time.

    .venv/bin/python bench/fleet.py [--rounds N] [--cli-rounds N] [--intents N] [--failovers N] [--ack-wait S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from covenant.client import DaemonClient  # noqa: E402
from covenant.fleet.client import FleetClient, NoLiveHost  # noqa: E402
from covenant.fleet.config import FleetConfig  # noqa: E402
from tests.fleet.conftest import FleetHost, make_host, signed, start_all, stop_all, wait_fleet, wait_for  # noqa: E402
from tests.fleet.nats_cluster import NatsCluster  # noqa: E402

COVENANT = Path(sys.executable).parent / "covenant"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def added_latency(hosts: list[FleetHost], servers: list[str], rounds: int, cli_rounds: int) -> dict[str, float]:
    host = hosts[0]
    key = Ed25519PrivateKey.generate()
    local: list[float] = []
    fleet: list[float] = []

    async def run() -> None:
        async with FleetClient(FleetConfig(servers=tuple(servers))) as client:
            for i in range(rounds + 10):
                body = signed(f"echo {i}", "benchecho@local", key)
                start = time.perf_counter()
                with DaemonClient(str(host.daemon.socket), timeout=60) as daemon:
                    assert daemon.request("POST", "/v1/dispatch", body)["outcome"] == "ok"
                took_local = time.perf_counter() - start
                body = signed(f"echo {i}", "benchecho@local", key)
                start = time.perf_counter()
                answer = await client.dispatch(body, "benchecho@local", 60)
                took_fleet = time.perf_counter() - start
                assert answer["outcome"] == "ok" and answer["host"] == host.name, answer
                if i >= 10:  # warm-up: first connections, the agent's first spawns
                    local.append(took_local)
                    fleet.append(took_fleet)

    asyncio.run(run())
    cli_local: list[float] = []
    cli_fleet: list[float] = []
    for i in range(cli_rounds):
        for args, into in (((), cli_local), (("--fleet",), cli_fleet)):
            start = time.perf_counter()
            done = subprocess.run([str(COVENANT), "dispatch", *args, "--agent", "benchecho", f"echo {i}"],
                                  env=host.daemon.env, capture_output=True, text=True, timeout=120)
            into.append(time.perf_counter() - start)
            assert done.returncode == 0, done.stderr
    return {
        "local_p50_ms": 1000 * statistics.median(local), "fleet_p50_ms": 1000 * statistics.median(fleet),
        "local_p90_ms": 1000 * pct(local, 0.9), "fleet_p90_ms": 1000 * pct(fleet, 0.9),
        "added_p50_ms": 1000 * (statistics.median(fleet) - statistics.median(local)),
        "cli_local_p50_ms": 1000 * statistics.median(cli_local), "cli_fleet_p50_ms": 1000 * statistics.median(cli_fleet),
        "cli_added_p50_ms": 1000 * (statistics.median(cli_fleet) - statistics.median(cli_local)),
    }


_SLEEPER_C = r"""
/* A rust-bin-style agent for the throughput figure: reads the intent line, sleeps 200 ms, answers. */
#include <stdio.h>
#include <string.h>
#include <time.h>
int main(void) {
    static char line[1 << 20];
    if (!fgets(line, sizeof line, stdin)) return 1;
    char *id = strstr(line, "\"id\":\""), *end;
    if (!id) return 1;
    id += 6;
    end = strchr(id, '"');
    if (!end) return 1;
    *end = 0;
    struct timespec pause = {0, 200000000};
    nanosleep(&pause, NULL);
    printf("{\"intent_id\":\"%s\",\"status\":\"ok\",\"text\":\"slept 0.2\",\"sources\":[]}\n", id);
    return 0;
}
"""


def install_sleeper(host: FleetHost, name: str, binary: Path) -> None:
    """The compiled 200 ms sleeper as agent ``name@local`` (runtime rust-bin: any executable)."""
    folder = host.home / "agents" / name
    folder.mkdir(parents=True)
    shutil.copy(binary, folder / "sleeper")
    os.chmod(folder / "sleeper", 0o755)
    (folder / "agent.toml").write_text(
        f'[agent]\nid = "{name}@local"\nname = "{name}"\nversion = "0.1.0"\nruntime = "rust-bin"\n'
        'entry = "sleeper"\n\n[capabilities]\nrequired = []\n\n[resources]\nnetwork = "off"\n')


def build_sleeper(directory: Path) -> Path | None:
    """The sleeper built with cc; None without a C compiler."""
    cc = shutil.which("cc")
    if cc is None:
        return None
    (directory / "sleeper.c").write_text(_SLEEPER_C)
    subprocess.run([cc, "-O2", "-o", str(directory / "sleeper"), str(directory / "sleeper.c")], check=True)
    return directory / "sleeper"


def throughput(servers: list[str], agent: str, intents: int) -> float:
    """Intents/s of ``intents`` dispatched at once to ``agent`` (each sleeps 200 ms)."""
    key = Ed25519PrivateKey.generate()

    async def run() -> float:
        async with FleetClient(FleetConfig(servers=tuple(servers))) as client:
            bodies = [signed(f"run {i}: sleep 0.2", agent, key) for i in range(intents)]
            start = time.perf_counter()
            answers = await asyncio.gather(*(client.dispatch(b, agent, 300) for b in bodies))
            took = time.perf_counter() - start
            assert all(a.get("outcome") == "ok" for a in answers), [a for a in answers if a.get("outcome") != "ok"][:2]
            return intents / took

    return asyncio.run(run())


def failover(hosts: list[FleetHost], servers: list[str], ack_wait_s: int) -> float:
    """kill -9 of the host running an intent -> the answer of its re-run elsewhere, in seconds."""
    body = signed("failover: sleep 1", "benchfail@local")
    intent_id = body["intent"]["id"]
    result: dict[str, object] = {}

    async def run() -> None:
        async with FleetClient(FleetConfig(servers=tuple(servers))) as client:
            result["answer"] = await client.dispatch(body, "benchfail@local", 120)
            result["at"] = time.monotonic()

    from tests.fleet.conftest import in_background

    future = in_background(lambda: asyncio.run(run()))
    victim = wait_for(lambda: next((h for h in hosts if intent_id in h.in_flight()), None), "the intent to start")
    killed_at = time.monotonic()
    victim.kill()
    future.result(timeout=120)
    answer = result["answer"]
    assert isinstance(answer, dict) and answer["host"] != victim.name and answer["deliveries"] >= 2, answer
    victim.start()
    return float(result["at"]) - killed_at  # type: ignore[arg-type]


def dead_host_seen(host: FleetHost, servers: list[str], agent: str) -> float:
    """kill -9 of the only host running ``agent`` -> `dispatch --fleet` answers no live host, in seconds.

    Killed just after its fleet process wrote its entry (the worst case: the entry lives its whole TTL).
    """
    from tests.fleet.conftest import fleet_status

    def written_since(ms: int) -> int | None:
        entry = next((h for h in fleet_status(servers)["hosts"] if h["host"] == host.name and h["up"]), None)
        return entry["ts"] if entry is not None and entry["ts"] > ms else None

    now_ms = int(time.time() * 1000)
    wait_for(lambda: written_since(now_ms), "the host's next entry", every=0.05)
    host.kill()
    killed_at = time.monotonic()

    async def gone() -> bool:
        async with FleetClient(FleetConfig(servers=tuple(servers))) as client:
            try:
                await client.route("", agent, None)
            except NoLiveHost:
                return True
            return False

    while not asyncio.run(gone()):
        time.sleep(0.2)
    seen = time.monotonic() - killed_at
    host.start()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="in-process dispatches each way (latency)")
    parser.add_argument("--cli-rounds", type=int, default=20, help="CLI processes each way (latency)")
    parser.add_argument("--intents", type=int, default=96, help="intents at once (throughput)")
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--ack-wait", type=int, default=5, help="[fleet] ack_wait_s of the hosts")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the daemons start agents as uids of their own (docs/security.md)")
    print(f"load average at start: {os.getloadavg()}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="covenant-bench-nats-"))
    cluster = NatsCluster(base, "/usr/sbin/nats-server").start()
    extra = {"ack_wait_s": args.ack_wait, "max_in_flight": 4}
    every = {"sleep3": ("slow.py", ()), "benchfail": ("slow.py", ())}
    hosts = [make_host("bench-1", cluster.servers, {**every, "benchecho": ("echo.py", ()), "sleep1": ("slow.py", ()),
                                                    "lonely": ("echo.py", ())}, fleet_extra=extra),
             make_host("bench-2", cluster.servers, every, fleet_extra=extra),
             make_host("bench-3", cluster.servers, every, fleet_extra=extra)]
    sleeper = build_sleeper(base)
    if sleeper is not None:
        install_sleeper(hosts[0], "csleep1", sleeper)
        for host in hosts:
            install_sleeper(host, "csleep3", sleeper)
    try:
        start_all(hosts)
        wait_fleet(cluster.servers, {h.name: {"sleep3@local", "benchfail@local"} for h in hosts})
        figures: dict[str, object] = {"ack_wait_s": args.ack_wait}
        figures.update(added_latency(hosts, cluster.servers, args.rounds, args.cli_rounds))
        print(json.dumps(figures), flush=True)
        one = throughput(cluster.servers, "sleep1@local", args.intents)
        three = throughput(cluster.servers, "sleep3@local", args.intents)
        figures.update(one_host_per_s=one, three_hosts_per_s=three, three_vs_one=three / one)
        if sleeper is not None:
            c_one = throughput(cluster.servers, "csleep1@local", args.intents)
            c_three = throughput(cluster.servers, "csleep3@local", args.intents)
            figures.update(compiled_one_host_per_s=c_one, compiled_three_hosts_per_s=c_three,
                           compiled_three_vs_one=c_three / c_one)
        print(json.dumps(figures), flush=True)
        times = [failover(hosts, cluster.servers, args.ack_wait) for _ in range(args.failovers)]
        wait_fleet(cluster.servers, {h.name: set() for h in hosts})
        figures.update(failover_s=times, failover_median_s=statistics.median(times))
        figures["dead_host_seen_s"] = dead_host_seen(hosts[0], cluster.servers, "lonely@local")
        print()
        print(f"latency, in-process client, p50 (p90): local {figures['local_p50_ms']:.2f} ms "
              f"({figures['local_p90_ms']:.2f}), fleet {figures['fleet_p50_ms']:.2f} ms ({figures['fleet_p90_ms']:.2f}); "
              f"added p50 {figures['added_p50_ms']:.2f} ms")
        print(f"latency, CLI processes, p50: local {figures['cli_local_p50_ms']:.1f} ms, fleet "
              f"{figures['cli_fleet_p50_ms']:.1f} ms; added {figures['cli_added_p50_ms']:.1f} ms")
        print(f"throughput, python3 agent sleeping 200 ms, capacity 4 per host, {args.intents} at once: 1 host "
              f"{one:.1f}/s, 3 hosts {three:.1f}/s: x{three / one:.2f}")
        if sleeper is not None:
            print(f"throughput, compiled agent sleeping 200 ms, same: 1 host {figures['compiled_one_host_per_s']:.1f}/s, "
                  f"3 hosts {figures['compiled_three_hosts_per_s']:.1f}/s: x{figures['compiled_three_vs_one']:.2f}")
        print(f"failover, kill -9 to the re-run's answer: {', '.join(f'{t:.2f}' for t in times)} s "
              f"(ack_wait_s {args.ack_wait}, goal <= {args.ack_wait + 2})")
        print(f"a dead host's agent reported unreachable after {figures['dead_host_seen_s']:.1f} s (host entry TTL 15 s)")
        print(json.dumps(figures))
    finally:
        stop_all(hosts)
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
