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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from covenant.client import DaemonClient, DaemonUnreachable
from tests.conftest import agent_uid_range, isolation_table, traversable_tmpdir
from tests.ops.test_units import UNITS, directives

DAEMON_UID = 4242
"""Outside every agent uid range: the daemon's own account."""
AGENTS = Path(__file__).parent / "agents"


def unit_capabilities(*, without: tuple[str, ...] = ()) -> str:
    caps = [cap for cap in directives(UNITS / "covenant.service")["AmbientCapabilities"][0].split() if cap not in without]
    return ",".join("+" + cap.removeprefix("CAP_").lower() for cap in caps)


def _agent(home: Path, name: str, source: str, resources: str = "") -> None:
    folder = home / "agents" / name
    folder.mkdir(parents=True)
    (folder / f"{name}.py").write_text(source)
    (folder / "agent.toml").write_text(
        f'[agent]\nid = "{name}@local"\nname = "{name}"\nversion = "0.1.0"\nruntime = "python3"\n'
        f'entry = "{name}.py"\n{resources}'
    )


@contextmanager
def daemon_with(caps: str, agents: dict[str, tuple[str, str]], tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], dict]]:
    """A daemon as DAEMON_UID holding ``caps`` (setpriv's syntax), with ``agents`` (name: (source,
    [resources] table)); yields its home, the CLI's environment and its first status document."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("starting the daemon as its own user with capabilities needs root and setpriv")
    base = traversable_tmpdir()
    home = base / "home"
    try:
        for name, (source, resources) in agents.items():
            _agent(home, name, source, resources)
        (home / "covenant.toml").write_text('[runtime]\npython3 = "/usr/bin/python3"\n\n'
                                            + isolation_table(agent_uid_range()) + 'require = true\n')
        for path in [base, *base.rglob("*")]:
            os.chown(path, DAEMON_UID, DAEMON_UID)
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
            yield home, env, doc
            assert daemon.poll() is None  # the daemon is still there
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _dispatch(env: dict[str, str], agent: str, text: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "covenant", "dispatch", text, "--agent", agent, "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_a_daemon_with_only_the_units_capabilities_isolates_agents(tmp_path: Path) -> None:
    # No network: egress needs /dev/net/tun for slirp4netns inside the daemon's user namespace, which a
    # host may keep root's (0600); either way the network namespace of their own is the unit's to give.
    off = '\n[resources]\nnetwork = "off"\n'
    agents = {name: ((AGENTS / f"{name}.py").read_text(), off) for name in ("introspect", "attacker")}
    with daemon_with(unit_capabilities(), agents, tmp_path) as (home, env, doc):
        assert doc["isolation"] == "uid" and doc["isolation_detail"]["problems"] == [], doc["isolation_detail"]
        network = doc["isolation_detail"]["network"]
        assert network["namespaces"] is True and (network["egress"] or network["problem"]), network
        outcome = _dispatch(env, "introspect@local", "look")
        seen = json.loads(outcome["text"])
        assert seen["uid"] not in (0, DAEMON_UID) and seen["groups"] == []
        assert seen["caps"] == {"CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapAmb": "0" * 16}
        assert seen["no_new_privs"] == "1"
        assert seen["tmp"] == sorted([home.parent.name, "left-behind"])  # a private /tmp: the home bound back
        # What it left in its 0700 scratch dir and its /tmp was measured and removed by the daemon.
        assert outcome["record"]["scratch_peak_bytes"] >= 8192
        assert all(not any(p.iterdir()) for p in (home / "state" / "scratch").iterdir())
        # The uid sweep works without root too (its helper drops the capabilities before kill(-1)).
        escaped = json.loads(_dispatch(env, "attacker@local", "attack escape")["text"])["pid"]
        ended = time.monotonic()
        while Path(f"/proc/{escaped}").exists() and time.monotonic() - ended < 3:
            time.sleep(0.02)
        assert not Path(f"/proc/{escaped}").exists() or "Z" in Path(f"/proc/{escaped}/stat").read_text().split(")")[1][:3]


def test_without_cap_sys_admin_network_off_agents_still_get_an_empty_namespace(tmp_path: Path) -> None:
    """operations.md's drop-in without CAP_SYS_ADMIN: no private /tmp (said in status), and
    ``network = "off"`` through ``unshare -U -n`` after the helper's switch to the agent's uid
    (before it, the helper could not be executed from inside the user namespace: exit 126)."""
    caps = unit_capabilities(without=("CAP_SYS_ADMIN", "CAP_SYS_CHROOT"))
    agents = {"offline": ((AGENTS / "offline.py").read_text(), '\n[resources]\nnetwork = "off"\n')}
    with daemon_with(caps, agents, tmp_path) as (_home, env, doc):
        assert doc["isolation"] == "uid"
        assert any("no private /tmp" in p for p in doc["isolation_detail"]["problems"]), doc["isolation_detail"]
        outcome = _dispatch(env, "offline@local", "look")
        seen = json.loads(outcome["text"])
        assert seen["netns"] != os.readlink("/proc/self/ns/net") and seen["interfaces"] == ["lo"], seen
        assert outcome["record"]["uid"] not in (None, 0, DAEMON_UID)
