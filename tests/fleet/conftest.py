"""The fleet under test: one 3-node NATS cluster and three covenant hosts, shared by every fleet test.

Real processes throughout: ``nats-server`` from the distribution (JetStream, R3 streams),
root daemons from :class:`tests.daemon.conftest.DaemonProcess` (each with agent uids of its
own) and a ``covenant fleet`` process per home. Every fleet test module carries the
``xdist_group("fleet")`` mark, so one worker runs them all and the cluster starts once. A
test that kills a host or a NATS node restarts it before it ends (the fixtures check).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.fleet.client import FleetClient
from covenant.fleet.config import FleetConfig
from covenant.fleet.subjects import AUDIT_STREAM, HOSTS_BUCKET, INTENTS_STREAM, RESULTS_STREAM
from covenant.keys import public_key_hex
from covenant.policy.signing import new_intent, sign_intent
from tests.conftest import require_tool, traversable_tmpdir
from tests.daemon.conftest import TEST_AGENTS, DaemonProcess
from tests.fleet.nats_cluster import NatsCluster

FLEET_AGENTS = Path(__file__).parent / "agents"
ACK_WAIT_S = 3
MAX_DELIVER = 5
MAX_IN_FLIGHT = 4


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60, every: float = 0.2) -> Any:
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def fleet_status(servers: list[str]) -> dict[str, Any]:
    """What `covenant fleet status --json` prints, read in-process."""

    async def read() -> dict[str, Any]:
        async with FleetClient(FleetConfig(servers=tuple(servers))) as client:
            return await client.status()

    return asyncio.run(read())


def signed(text: str, agent: str | None, key: Ed25519PrivateKey | None = None) -> dict[str, Any]:
    """A dispatch body as the CLI builds it, signed by ``key`` (a fresh issuer by default)."""
    key = key or Ed25519PrivateKey.generate()
    intent = new_intent(text, issuer_display="batch@test", issuer_pubkey=public_key_hex(key), agent=agent)
    return {"intent": intent, "signature": sign_intent(key, intent)}


def dispatch_batch(servers: list[str], agent: str, texts: list[str], timeout: float = 120) -> list[dict[str, Any]]:
    """Dispatch every text to ``agent`` over the fleet at once (one client, one issuer); the answers in order."""
    key = Ed25519PrivateKey.generate()

    async def run() -> list[dict[str, Any]]:
        async with FleetClient(FleetConfig(servers=tuple(servers))) as client:
            return list(await asyncio.gather(*(client.dispatch(signed(t, agent, key), agent, timeout) for t in texts)))

    return asyncio.run(run())


def in_background(function: Callable[[], Any]) -> "Future[Any]":
    """Run ``function`` in a thread of its own; the future has its result."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(function)
    pool.shutdown(wait=False)
    return future


def streams_ready(servers: list[str]) -> bool:
    """Every stream of the fleet has a leader and every replica is current (after a NATS node came back)."""
    from nats.errors import Error as NatsError

    async def check() -> bool:
        async with FleetClient(FleetConfig(servers=tuple(servers))) as client:
            for stream in (INTENTS_STREAM, RESULTS_STREAM, AUDIT_STREAM, f"KV_{HOSTS_BUCKET}"):
                try:
                    cluster = (await client.js.stream_info(stream)).cluster
                except (NatsError, TimeoutError):
                    return False
                if cluster is None or not cluster.leader or not all(r.current for r in cluster.replicas or []):
                    return False
            return True

    return asyncio.run(check())


def fleet_table(servers: list[str], host: str, **extra: Any) -> str:
    """``[fleet]`` of a test host: short ack_wait_s, a few places per agent; ``extra`` overrides."""
    keys: dict[str, Any] = {"servers": servers, "host": host, "ack_wait_s": ACK_WAIT_S, "max_deliver": MAX_DELIVER,
                            "max_in_flight": MAX_IN_FLIGHT, **extra}
    return "[fleet]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in keys.items())


@dataclass
class FleetHost:
    """One covenant home in the fleet: its daemon and its `covenant fleet` process."""

    name: str
    daemon: DaemonProcess
    base: Path
    fleet: subprocess.Popen[bytes] | None = None
    fleet_logs: list[Path] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.daemon.home

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.daemon.cli(*args, timeout=timeout)

    def start_fleet(self) -> None:
        assert self.fleet is None or self.fleet.poll() is not None
        path = self.base / f"fleet-{time.monotonic_ns()}.log"
        self.fleet_logs.append(path)
        with open(path, "wb") as log:
            self.fleet = subprocess.Popen([sys.executable, "-m", "covenant", "fleet"], env=self.daemon.env,
                                          stdout=log, stderr=subprocess.STDOUT)

    def start(self) -> None:
        self.daemon.start()
        self.start_fleet()

    def kill(self) -> None:
        """kill -9 of the daemon and the fleet process, as a host that lost power."""
        for process in (self.fleet, self.daemon.process):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=30)

    def stop_fleet(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        assert self.fleet is not None
        if self.fleet.poll() is None:
            self.fleet.send_signal(sig)
        return self.fleet.wait(timeout=timeout)

    def stop(self) -> None:
        if self.fleet is not None and self.fleet.poll() is None:
            self.stop_fleet()
        if self.daemon.process is not None and self.daemon.process.poll() is None:
            self.daemon.stop()

    @property
    def alive(self) -> bool:
        return all(p is not None and p.poll() is None for p in (self.fleet, self.daemon.process))

    def in_flight(self) -> list[str]:
        """The intents its daemon runs now."""
        status = self.daemon.api("GET", "/v1/status")
        assert isinstance(status, dict)
        return [entry["intent"] for entry in status["in_flight"]]

    def fleet_log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.fleet_logs if p.exists())

    def records(self) -> list[dict[str, Any]]:
        """Every dispatch record of this home, through its daemon."""
        answer = self.daemon.api("GET", "/v1/dispatches?limit=10000")
        assert isinstance(answer, dict)
        return answer["dispatches"]

    def audit(self, type_: str) -> list[dict[str, Any]]:
        """The data of every audit record of ``type_`` in this home's log."""
        from covenant.audit.reader import Entry, iter_records

        return [e.record["data"] for e in iter_records(self.home / "audit")
                if isinstance(e, Entry) and e.record["type"] == type_]


def make_host(name: str, servers: list[str], agents: dict[str, tuple[str, tuple[str, ...]]],
              fleet_extra: dict[str, Any] | None = None, config: str = "") -> FleetHost:
    """A fresh home (initialised, not started) with ``agents`` (name -> (script, keywords)) and ``[fleet]``."""
    base = traversable_tmpdir("covenant-fleet-")
    sock_dir = Path(tempfile.mkdtemp(prefix="cov-", dir=base))
    os.chmod(sock_dir, 0o755)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(base),
        "COVENANT_HOME": str(base / "home"),
        "COVENANT_SOCKET": str(sock_dir / "covenant.sock"),
        "XDG_CONFIG_HOME": str(base / "xdg"),
        "USER": "tester",
        "LANG": "C.UTF-8",
    }
    daemon = DaemonProcess(home=base / "home", socket=sock_dir / "covenant.sock", env=env)
    daemon.cli("init", "--display", f"tester@{name}", check=True)
    daemon.write_config(fleet_table(servers, name, **(fleet_extra or {})) + "[daemon]\nmax_concurrent = 8\n" + config)
    for agent, (script, keywords) in agents.items():
        add_agent(daemon, agent, script, keywords)
    return FleetHost(name=name, daemon=daemon, base=base)


def add_agent(daemon: DaemonProcess, name: str, script: str, keywords: tuple[str, ...]) -> Path:
    """A test agent (tests/fleet/agents, else tests/daemon/agents) with ``network = "off"``: no egress needed."""
    manifest = daemon.add_agent(name, "echo.py", keywords=keywords)
    source = FLEET_AGENTS / script if (FLEET_AGENTS / script).exists() else TEST_AGENTS / script
    (manifest.parent / "echo.py").unlink()
    shutil.copy(source, manifest.parent / script)
    os.chmod(manifest.parent / script, 0o644)
    text = manifest.read_text().replace('entry = "echo.py"', f'entry = "{script}"', 1)
    if 'network = "off"' not in text:
        text = text.replace("[resources]\n", '[resources]\nnetwork = "off"\n', 1)
    manifest.write_text(text)
    return manifest


def wait_fleet(servers: list[str], hosts: dict[str, set[str]], timeout: float = 120) -> dict[str, Any]:
    """Until each host in ``hosts`` is up in COVENANT_HOSTS with (at least) those agents."""

    from nats.errors import Error as NatsError

    def ready() -> dict[str, Any] | None:
        try:
            status = fleet_status(servers)
        except (NatsError, TimeoutError, OSError):
            return None  # the cluster is still electing, or busy: ask again
        up = {h["host"]: {a["id"] for a in h.get("agents") or []} for h in status["hosts"] if h["up"]}
        return status if all(name in up and agents <= up[name] for name, agents in hosts.items()) else None

    return wait_for(ready, f"hosts {sorted(hosts)} up in the fleet with their agents", timeout, every=0.3)


@dataclass
class Fleet:
    cluster: NatsCluster
    hosts: dict[str, FleetHost]

    @property
    def servers(self) -> list[str]:
        return self.cluster.servers

    def healthy(self) -> None:
        """Every host and NATS node runs, and every host is up in the fleet: what each test leaves behind."""
        for node in self.cluster.nodes:
            if node.process is None or node.process.poll() is not None:
                self.cluster.restart(node)
        wait_for(lambda: streams_ready(self.servers), "every stream to have a leader and current replicas")
        for host in self.hosts.values():
            if not host.alive:
                host.kill()
                host.start()
        try:
            wait_fleet(self.servers, {name: set() for name in self.hosts}, timeout=120)
        except AssertionError as exc:
            logs = "\n".join(f"--- {n} (fleet {h.fleet.poll() if h.fleet else None})\n{h.fleet_log()[-2000:]}"
                             for n, h in self.hosts.items())
            raise AssertionError(f"{exc}\n{logs}") from None


@pytest.fixture(scope="session")
def nats_cluster() -> Iterator[NatsCluster]:
    binary = require_tool("nats-server")  # Debian package nats-server; .ci/run installs it
    directory = Path(tempfile.mkdtemp(prefix="covenant-nats-"))
    cluster = NatsCluster(directory, binary)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


# Three hosts: echo and slow everywhere, `big` on host-b alone, `onlyc` on host-c alone.
HOST_AGENTS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "host-a": {"echo": ("echo.py", ("echo",)), "slow": ("slow.py", ("sleep",))},
    "host-b": {"echo": ("echo.py", ("echo",)), "slow": ("slow.py", ("sleep",)), "big": ("big.py", ())},
    "host-c": {"echo": ("echo.py", ("echo",)), "slow": ("slow.py", ("sleep",)), "onlyc": ("echo.py", ("only",))},
}


def start_all(hosts: list[FleetHost]) -> None:
    """Start the hosts side by side (a daemon's start is mostly imports: two cores do two at once)."""
    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(FleetHost.start, hosts))


def stop_all(hosts: list[FleetHost]) -> None:
    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(FleetHost.stop, hosts))
    for host in hosts:
        shutil.rmtree(host.base, ignore_errors=True)


@pytest.fixture(scope="session")
def fleet(nats_cluster: NatsCluster) -> Iterator[Fleet]:
    hosts = {name: make_host(name, nats_cluster.servers, agents) for name, agents in HOST_AGENTS.items()}
    try:
        start_all(list(hosts.values()))
        wait_fleet(nats_cluster.servers, {name: {f"{a}@local" for a in agents} for name, agents in HOST_AGENTS.items()})
        yield Fleet(nats_cluster, hosts)
    finally:
        stop_all(list(hosts.values()))


@pytest.fixture
def healthy_fleet(fleet: Fleet) -> Iterator[Fleet]:
    """The shared fleet, checked healthy before the test and brought back to health after it."""
    fleet.healthy()
    yield fleet
    fleet.healthy()
