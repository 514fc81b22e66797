"""A real daemon process on a temp home, and a real CLI to talk to it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from covenant.client import DaemonClient, DaemonUnreachable
from covenant.home import Home
from covenant.runtime.cpu_class import CpuGroups
from tests.conftest import agent_uid_range, isolation_table, traversable_tmpdir

TEST_AGENTS = Path(__file__).parent / "agents"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class DaemonProcess:
    """A `covenant daemon` child process plus the paths and env to talk to it."""

    home: Path
    socket: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default=Path("/dev/null"))
    uid_range: tuple[int, int] = field(default_factory=agent_uid_range)
    """Its agents' uids, in every covenant.toml it is given (see :func:`tests.conftest.agent_uid_range`)."""

    def cli(self, *args: str, check: bool = False, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "covenant", *args],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"covenant {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def cli_background(self, *args: str) -> subprocess.Popen[str]:
        """Start `covenant ARGS…` without waiting; the caller communicates with it."""
        return subprocess.Popen([sys.executable, "-m", "covenant", *args], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def start(self, *extra: str) -> None:
        assert self.process is None or self.process.poll() is not None
        self.log_path = self.home.parent / f"daemon-{time.monotonic_ns()}.log"
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "covenant", "daemon", *extra],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited {self.process.returncode}:\n{self.log()}")
            try:
                with DaemonClient(self.socket, timeout=5) as client:
                    client.request("GET", "/v1/status")
                return
            except DaemonUnreachable:
                time.sleep(0.05)
        raise AssertionError(f"daemon not ready after {timeout} s:\n{self.log()}")

    def api(self, method: str, path: str, body: object = None) -> object:
        with DaemonClient(self.socket, timeout=60) as client:
            return client.request(method, path, body)

    def descendants(self) -> list[psutil.Process]:
        """Every live process under the daemon (its agents, replicas, servers, and escapes it adopted)."""
        assert self.process is not None
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def write_config(self, text: str) -> None:
        """covenant.toml as ``text`` says, with ``[isolation] uid_range`` set to :attr:`uid_range` unless it sets one."""
        (self.home / "covenant.toml").write_text(self.with_uid_range(textwrap.dedent(text)))

    def with_uid_range(self, text: str) -> str:
        """``text`` (covenant.toml) with :attr:`uid_range` in its ``[isolation]`` table, unless it sets one."""
        if re.search(r"^\s*uid_range\s*=", text, re.MULTILINE):
            return text
        table = isolation_table(self.uid_range)
        header = re.search(r"^\[isolation\][ \t]*(#.*)?$", text, re.MULTILINE)
        if header is None:
            return text + "\n" + table
        return text[: header.end()] + "\n" + table.split("\n", 1)[1].rstrip("\n") + text[header.end():]

    def start_with_one_slot(self, *extra: str) -> None:
        """Start with one run slot and a one-place queue, and the slow agent (keyword ``sleep``)."""
        self.write_config("""
            [daemon]
            max_concurrent = 1
            queue_max = 1
        """)
        self.add_agent("slow", "slow.py", keywords=("sleep",))
        self.start(*extra)

    def add_agent(self, name: str, script: str, *, keywords: tuple[str, ...] = (), required: tuple[str, ...] = (),
                  cpu_ms: int = 30_000, extra: str = "") -> Path:
        """Install a python3 test agent from tests/daemon/agents as <home>/agents/<name>/.

        With no network: what it does needs none, and egress would need slirp4netns and nftables
        (tests/security/test_agent_network.py proves those)."""
        folder = self.home / "agents" / name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(TEST_AGENTS / script, folder / script)
        os.chmod(folder / script, 0o644)
        manifest = folder / "agent.toml"
        manifest.write_text(textwrap.dedent(f"""\
            [agent]
            id = "{name}@local"
            name = "{name}"
            version = "0.1.0"
            runtime = "python3"
            entry = "{script}"

            [capabilities]
            required = {json.dumps(list(required))}

            [resources]
            cpu_ms_per_task = {cpu_ms}
            network = "off"

            [routing]
            keywords = {json.dumps(list(keywords))}
            """) + extra)
        return manifest


def agent_processes(home: Path) -> list[psutil.Process]:
    """Live processes working inside ``home`` (agents run with their manifest folder as cwd)."""
    found = []
    for proc in psutil.process_iter(["cwd"]):
        cwd = proc.info.get("cwd") or ""
        if cwd.startswith(str(home)):
            found.append(proc)
    return found


@contextmanager
def daemon_home(tmp_path: Path) -> Iterator[DaemonProcess]:
    """An initialised home with its own socket dir (short path, world-traversable for uid tests); on exit its
    daemon, if still running, is stopped and both dirs are removed. ``tmp_path`` holds the user's files.

    The home lives in a 0711 dir under /tmp, not in pytest's 0700 tmp_path: run
    as root, the daemon starts agents as other uids, which must reach agents/.
    """
    base = traversable_tmpdir()
    home = base / "home"
    sock_dir = Path(tempfile.mkdtemp(prefix="cov-"))
    os.chmod(sock_dir, 0o755)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "COVENANT_HOME": str(home),
        "COVENANT_SOCKET": str(sock_dir / "covenant.sock"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "USER": "tester",
        "LANG": "C.UTF-8",
    }
    proc = DaemonProcess(home=home, socket=sock_dir / "covenant.sock", env=env)
    proc.cli("init", "--display", "tester@test", check=True)
    proc.write_config((home / "covenant.toml").read_text())  # init's commented file, with the test's uid range
    try:
        yield proc
    finally:
        if proc.process is not None and proc.process.poll() is None:
            # Left running (a test that failed, or had no need to stop it): a clean stop still sweeps what its
            # agents left behind. A second SIGTERM cancels what is still in flight instead of draining it.
            for wait_s in (2, 30):
                proc.process.terminate()
                try:
                    proc.process.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                proc.process.kill()
                proc.process.wait()
        # A daemon a test killed leaves its agents' CPU groups (the next start on the home would remove them).
        CpuGroups.open(str(Home(home).state_dir.resolve()))
        shutil.rmtree(sock_dir, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A :func:`daemon_home` for one test."""
    with daemon_home(tmp_path) as proc:
        yield proc
