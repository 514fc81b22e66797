"""The daemon as the shipped unit runs it: its own non-root user holding only the unit's capabilities.

setpriv stands in for systemd (no systemd as PID 1 here): the same uid change
and the same ambient capabilities as ``User=`` plus ``AmbientCapabilities=``
in systemd/covenant.service.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from covenant.client import DaemonClient, DaemonUnreachable
from tests.conftest import traversable_tmpdir
from tests.ops.test_units import UNITS, directives

DAEMON_UID = 4242
"""Outside every agent uid range: the daemon's own account."""
AGENTS = Path(__file__).parent / "agents"


def unit_capabilities() -> str:
    caps = directives(UNITS / "covenant.service")["AmbientCapabilities"][0].split()
    return ",".join("+" + cap.removeprefix("CAP_").lower() for cap in caps)


def test_a_daemon_with_only_the_units_capabilities_isolates_agents(tmp_path: Path) -> None:
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("starting the daemon as its own user with capabilities needs root and setpriv")
    base = traversable_tmpdir()
    home = base / "home"
    try:
        folder = home / "agents" / "introspect"
        folder.mkdir(parents=True)
        shutil.copy(AGENTS / "introspect.py", folder / "introspect.py")
        (folder / "agent.toml").write_text(
            '[agent]\nid = "introspect@local"\nname = "introspect"\nversion = "0.1.0"\n'
            'runtime = "python3"\nentry = "introspect.py"\n'
        )
        attacker = home / "agents" / "attacker"
        attacker.mkdir()
        shutil.copy(AGENTS / "attacker.py", attacker / "attacker.py")
        (attacker / "agent.toml").write_text(
            '[agent]\nid = "attacker@local"\nname = "attacker"\nversion = "0.1.0"\n'
            'runtime = "python3"\nentry = "attacker.py"\n'
        )
        (home / "covenant.toml").write_text('[runtime]\npython3 = "/usr/bin/python3"\n\n[isolation]\nrequire = true\n')
        for path in [base, *base.rglob("*")]:
            os.chown(path, DAEMON_UID, DAEMON_UID)
        caps = unit_capabilities()
        as_daemon = [setpriv, f"--reuid={DAEMON_UID}", f"--regid={DAEMON_UID}", "--clear-groups",
                     f"--inh-caps={caps}", f"--ambient-caps={caps}", "--"]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "COVENANT_HOME": str(home), "LANG": "C.UTF-8",
               "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
        log_path = base / "daemon.log"
        with open(log_path, "wb") as log:
            daemon = subprocess.Popen([*as_daemon, sys.executable, "-m", "covenant", "daemon"], env=env, stdout=log,
                                      stderr=subprocess.STDOUT)
        try:
            sock = home / "run" / "covenant.sock"
            deadline = time.monotonic() + 60
            doc = None
            while doc is None and time.monotonic() < deadline:
                assert daemon.poll() is None, log_path.read_text()
                try:
                    with DaemonClient(sock, timeout=5) as client:
                        doc = client.request("GET", "/v1/status")
                except DaemonUnreachable:
                    time.sleep(0.05)
            assert doc is not None, log_path.read_text()
            assert doc["isolation"] == "uid" and doc["isolation_detail"]["problems"] == [], doc["isolation_detail"]
            done = subprocess.run([sys.executable, "-m", "covenant", "dispatch", "look", "--agent", "introspect@local",
                                   "--json"], env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            outcome = json.loads(done.stdout)
            seen = json.loads(outcome["text"])
            assert seen["uid"] not in (0, DAEMON_UID) and seen["groups"] == []
            assert seen["caps"] == {"CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapAmb": "0" * 16}
            assert seen["no_new_privs"] == "1"
            assert seen["tmp"] == sorted([base.name, "left-behind"])  # a private /tmp: the home bound back
            # What it left in its 0700 scratch dir and its /tmp was measured and removed by the daemon.
            assert outcome["record"]["scratch_peak_bytes"] >= 8192
            assert all(not any(p.iterdir()) for p in (home / "state" / "scratch").iterdir())
            # The uid sweep works without root too (its helper drops the capabilities before kill(-1)).
            done = subprocess.run([sys.executable, "-m", "covenant", "dispatch", "attack escape", "--agent",
                                   "attacker@local", "--json"], env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            escaped = json.loads(json.loads(done.stdout)["text"])["pid"]
            ended = time.monotonic()
            while Path(f"/proc/{escaped}").exists() and time.monotonic() - ended < 3:
                time.sleep(0.02)
            assert not Path(f"/proc/{escaped}").exists() or "Z" in Path(f"/proc/{escaped}/stat").read_text().split(")")[1][:3]
            assert daemon.poll() is None  # the daemon is still there
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    finally:
        shutil.rmtree(base, ignore_errors=True)
