"""A real NATS cluster with JetStream on loopback: ``nats-server`` processes from the distribution.

Used by the fleet tests (one cluster for the whole session) and by bench/fleet.py. Ports
are chosen free when it starts, the stores live under the given directory, and nodes can
be killed (SIGKILL) and restarted on the same ports and store.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NatsNode", "NatsCluster", "free_ports"]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class NatsNode:
    name: str
    port: int
    cluster_port: int
    http_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def config(self, routes: list[str]) -> str:
        store = self.directory / "store"
        return (
            f"server_name: {self.name}\n"
            f"listen: 127.0.0.1:{self.port}\n"
            f"http: 127.0.0.1:{self.http_port}\n"
            f'jetstream {{ store_dir: "{store}", max_memory_store: 67108864, max_file_store: 1073741824 }}\n'
            f"cluster {{ name: covenant-test, listen: 127.0.0.1:{self.cluster_port}, routes: [{', '.join(routes)}] }}\n"
        )

    def start(self, binary: str, routes: list[str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "nats.conf"
        conf.write_text(self.config(routes))
        log = open(self.directory / "nats.log", "ab")
        self.process = subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def kill(self) -> None:
        """SIGKILL, as a crash or a pulled plug."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def jsz(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/jsz", timeout=2) as answer:
            return json.loads(answer.read())

    def log(self) -> str:
        return (self.directory / "nats.log").read_text(errors="replace")


@dataclass
class NatsCluster:
    """``size`` nodes routed to each other, JetStream on each (R3 streams need three)."""

    directory: Path
    binary: str
    size: int = 3
    nodes: list[NatsNode] = field(default_factory=list)

    def start(self, timeout: float = 60) -> "NatsCluster":
        ports = free_ports(3 * self.size)
        self.nodes = [NatsNode(f"n{i + 1}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2], self.directory / f"n{i + 1}")
                      for i in range(self.size)]
        for node in self.nodes:
            node.start(self.binary, self.routes)
        self.wait_ready(timeout)
        return self

    @property
    def routes(self) -> list[str]:
        return [f"nats-route://127.0.0.1:{n.cluster_port}" for n in self.nodes]

    @property
    def servers(self) -> list[str]:
        return [n.url for n in self.nodes]

    def restart(self, node: NatsNode, timeout: float = 60) -> None:
        node.start(self.binary, self.routes)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60) -> None:
        """Every running node answers and they agree on a JetStream meta leader with all peers current."""
        deadline = time.monotonic() + timeout
        problem = "not started"
        while time.monotonic() < deadline:
            try:
                leaders = set()
                for node in self.nodes:
                    if node.process is None or node.process.poll() is not None:
                        continue
                    meta = node.jsz().get("meta_cluster") or {}
                    leaders.add(meta.get("leader"))
                    replicas = meta.get("replicas") or []
                    if meta.get("leader") == node.name and not all(r.get("current") for r in replicas):
                        raise RuntimeError("a peer is not current yet")
                if len(leaders) == 1 and None not in leaders and "" not in leaders:
                    return
                problem = f"leaders seen: {leaders}"
            except (OSError, ValueError, RuntimeError) as exc:
                problem = str(exc)
            time.sleep(0.2)
        logs = "\n".join(f"--- {n.name}\n{n.log()[-3000:]}" for n in self.nodes)
        raise AssertionError(f"NATS cluster not ready after {timeout} s ({problem}):\n{logs}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
