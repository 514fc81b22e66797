"""A real daemon running as root on a temp home, with the attacker agent installed.

The attacker corpus needs root: only then does the daemon run agents as
other uids. Without root the tests skip with that reason (a laptop); CI runs
as root, where nothing here skips.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_tool, traversable_tmpdir
from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer
from tests.rune.conftest import add_process_tool, add_rune_agent, configure

ATTACKER = Path(__file__).parent / "agents" / "attacker.py"
MAX_PROCESSES = 48
DISK_MB = 8


def start_with_hostile_tool(daemon: DaemonProcess, fake_model: FakeModelServer, name: str, script: str,
                            *, extra: str = "") -> None:
    """chat@local, a Rune agent on the fake model whose one process tool ``name`` is
    ``tests/security/agents/<script>``, granted to the tester; the daemon started."""
    configure(daemon, ("fake", fake_model), extra=extra)
    source = (Path(__file__).parent / "agents" / script).read_text()
    add_process_tool(add_rune_agent(daemon, toolset=(name,)), name, source)
    daemon.start()
    daemon.cli("grant", "tester@test", f"tool.{name}", check=True)


def processes_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid``, from /proc/<pid>/status (non-dumpable too)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                text = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        if int(fields["Uid"].split()[0]) == uid:
            found.append(int(name))
    return found


class AttackedDaemon(DaemonProcess):
    def attack(self, *words: str, agent: str = "attacker@local") -> tuple[dict, dict]:
        """Dispatch ``attack WORDS…``; return (the outcome document, the agent's report)."""
        done = self.cli("dispatch", " ".join(("attack", *words)), "--agent", agent, "--json", timeout=180)
        assert done.returncode == 0, f"the dispatch itself must run: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        outcome = json.loads(done.stdout)
        assert outcome["outcome"] == "ok", outcome
        return outcome, json.loads(outcome["text"])


@pytest.fixture
def attacked(tmp_path: Path) -> Iterator[AttackedDaemon]:
    """A root daemon on the default socket (<home>/run/covenant.sock) with attacker@local and attacker-offline@local."""
    if os.geteuid() != 0:
        pytest.skip("the attacker corpus needs root: only a root daemon runs agents as other uids")
    # attacker@local has network = "full": egress from its own namespace (slirp4netns, nftables).
    require_tool("slirp4netns")
    require_tool("nft")
    base = traversable_tmpdir()
    home = base / "home"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "COVENANT_HOME": str(home),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "USER": "tester",
        "LANG": "C.UTF-8",
    }
    daemon = AttackedDaemon(home=home, socket=home / "run" / "covenant.sock", env=env)
    daemon.cli("init", "--display", "tester@test", check=True)
    daemon.write_config(f"""
        [runtime]
        python3 = "/usr/bin/python3"
        kill_grace_ms = 500

        [isolation]
        require = true
        max_processes = {MAX_PROCESSES}
    """)
    for name, network in (("attacker", "full"), ("attacker-offline", "off")):
        folder = home / "agents" / name
        folder.mkdir(parents=True)
        shutil.copy(ATTACKER, folder / "attacker.py")
        (folder / "attacker.py").chmod(0o644)
        (folder / "agent.toml").write_text(textwrap.dedent(f"""\
            [agent]
            id = "{name}@local"
            name = "{name}"
            version = "0.1.0"
            runtime = "python3"
            entry = "attacker.py"

            [resources]
            cpu_ms_per_task = 60000
            memory_mb = 512
            disk_mb = {DISK_MB}
            network = "{network}"
            """))
    assert sys.executable  # the daemon runs on the test's interpreter (the venv of /usr/bin/python3)
    yield daemon
    if daemon.process is not None and daemon.process.poll() is None:
        daemon.process.kill()
        daemon.process.wait()
    shutil.rmtree(base, ignore_errors=True)
