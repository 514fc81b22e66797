"""resource_profile as a class of CPU and memory: the replica's and its tools' nice, and the agent's CPU group.

A real root daemon, real replicas and process tools; each tool reports what the kernel says of itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.processes import alive
from tests.rune.conftest import add_process_tool, add_rune_agent, configure, outcome_of

# The tool reads its own nice (/proc/self/stat field 19), its CPU group, and tries what an agent must not:
# change its group's quota, and move itself out into the parent group.
PROBE = r"""
import json, sys
json.load(sys.stdin)
stat = open('/proc/self/stat').read()
nice = int(stat[stat.rindex(')') + 2:].split()[16])
groups = dict(line.split(':', 2)[1:] for line in open('/proc/self/cgroup').read().splitlines())
cpu = next((path for names, path in groups.items() if 'cpu' in names.split(',')), groups.get(''))
mount = '/sys/fs/cgroup/cpu' if 'cpu' in ','.join(groups) else '/sys/fs/cgroup/unified'
def attempt(path, text):
    try:
        with open(path, 'w') as f:
            f.write(text)
        return 'written'
    except OSError as exc:
        return exc.__class__.__name__
here = mount + cpu
quota = here + ('/cpu.cfs_quota_us' if mount.endswith('/cpu') else '/cpu.max')
print(json.dumps({'nice': nice, 'cgroup': cpu, 'quota': attempt(quota, '-1'),
                  'escape': attempt(here.rsplit('/', 1)[0] + '/cgroup.procs', str(__import__('os').getpid()))}))
"""


def _probe(d: DaemonProcess, fake: FakeModelServer, agent: str, *extra: str) -> dict:
    fake.script(Reply.tools(ToolCall("probe", {})), Reply(text="done"))
    outcome = outcome_of(d.cli("dispatch", "probe yourself", "--agent", agent, "--json", *extra))
    assert outcome["outcome"] == "ok", outcome
    return json.loads([m for m in fake.requests[-1].messages if m["role"] == "tool"][-1]["content"])


def _agent(d: DaemonProcess, name: str, profile: str) -> None:
    package = add_rune_agent(d, name, toolset=("probe",), runtime=f"resource_profile: {profile}\nstartup_timeout_ms: 30000")
    add_process_tool(package, "probe", PROBE)


def _nice(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[16])


def _replica_pid(d: DaemonProcess, agent: str) -> int:
    replicas = d.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
    return next(r["pid"] for r in replicas if r["agent"] == agent)


def _quota(group: Path) -> str:
    if (group / "cpu.max").exists():
        return (group / "cpu.max").read_text().strip()
    return (group / "cpu.cfs_quota_us").read_text().strip() + " " + (group / "cpu.cfs_period_us").read_text().strip()


def test_the_profile_sets_nice_and_cpu_share_of_the_replica_and_its_tools(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    if os.geteuid() != 0:
        pytest.skip("process tools run only with agent uids and Landlock (a root daemon)")
    configure(daemon, ("fake", fake_model), extra="[rune]\nnice_medium = 3\ncpu_medium = 0.25\nwarm = 1\n")
    _agent(daemon, "smol", "small")
    _agent(daemon, "mid", "medium")
    _agent(daemon, "big", "large")
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.probe", check=True)
    share = daemon.api("GET", "/v1/status")["cpu_share"]  # type: ignore[index]

    small = _probe(daemon, fake_model, "smol@local")
    assert small["nice"] == 10 and _nice(_replica_pid(daemon, "smol@local")) == 10, small
    assert _probe(daemon, fake_model, "smol@local", "--priority", "low")["nice"] == 19  # 10 + 10, clamped
    assert _probe(daemon, fake_model, "mid@local", "--priority", "low")["nice"] == 13  # 3 + 10
    assert _probe(daemon, fake_model, "mid@local", "--priority", "high")["nice"] == -2  # 3 - 5: a root daemon may
    big = _probe(daemon, fake_model, "big@local")
    assert big["nice"] == 0 and _nice(_replica_pid(daemon, "big@local")) == 0, big
    shown = json.loads(daemon.cli("agents", "show", "mid@local", "--json", check=True).stdout)
    assert shown["resource_class"] == {"profile": "medium", "nice": 3, "cpu_cores": 0.25, "memory_mb": 1024}
    assert "nice 3, 0.25 CPU cores, 1024 MiB" in daemon.cli("agents", "show", "mid@local", check=True).stdout

    if share["controller"] is None:
        assert share["problem"] and "NO CPU share" in daemon.cli("status", check=True).stdout
        assert daemon.stop() == 0
        pytest.skip(f"no writable CPU controller on this host ({share['problem']}): nice checked, groups not")
    parent = Path(share["parent"])
    assert parent.name.startswith("covenant_")
    for agent, quota in (("smol@local", "50000 100000"), ("mid@local", "25000 100000"), ("big@local", "200000 100000")):
        group = parent / agent
        assert _quota(group) == quota, agent
        replica = _replica_pid(daemon, agent)
        assert str(replica) in (group / "cgroup.procs").read_text().split()
    # The tool ran in its agent's group and could neither change its quota nor leave it.
    assert small["cgroup"].endswith(f"/{parent.name}/smol@local"), small
    assert (small["quota"], small["escape"]) == ("PermissionError", "PermissionError"), small
    assert _quota(parent / "smol@local") == "50000 100000"
    assert "CPU share" in daemon.cli("status", check=True).stdout

    # A reload that withdraws an agent removes its group once its replica (and its warm spare) are gone.
    shutil.rmtree(daemon.home / "agents" / "big")
    daemon.cli("reload", check=True)
    deadline = time.monotonic() + 60
    while (parent / "big@local").exists():
        assert time.monotonic() < deadline, "the withdrawn agent's CPU group was not removed"
        time.sleep(0.05)
    assert (parent / "smol@local").is_dir() and (parent / "mid@local").is_dir()

    assert daemon.stop() == 0
    assert not parent.exists()


def test_groups_of_a_killed_daemon_are_removed_at_the_next_start(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    if os.geteuid() != 0:
        pytest.skip("process tools run only with agent uids and Landlock (a root daemon)")
    configure(daemon, ("fake", fake_model))
    _agent(daemon, "smol", "small")
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.probe", check=True)
    share = daemon.api("GET", "/v1/status")["cpu_share"]  # type: ignore[index]
    if share["controller"] is None:
        daemon.stop()
        pytest.skip(f"no writable CPU controller on this host: {share['problem']}")
    _probe(daemon, fake_model, "smol@local")
    parent = Path(share["parent"])
    replica = _replica_pid(daemon, "smol@local")
    # A process left in a group of the dead daemon (as if it escaped PDEATHSIG): killed, and its group removed.
    ghost = subprocess.Popen(["sleep", "600"])
    (parent / "ghost").mkdir()
    (parent / "ghost" / "cgroup.procs").write_text(str(ghost.pid))
    daemon.stop(signal.SIGKILL)
    deadline = time.monotonic() + 30
    while alive(replica) and time.monotonic() < deadline:  # PDEATHSIG ends the replica with its daemon
        time.sleep(0.05)
    assert (parent / "smol@local").is_dir() and (parent / "ghost").is_dir()

    daemon.start()
    try:
        assert ghost.wait(timeout=30) == -signal.SIGKILL
        assert not parent.exists()  # made again only at an agent's first launch
    finally:
        if ghost.poll() is None:
            ghost.kill()
            ghost.wait()
    assert daemon.stop() == 0
    assert not parent.exists()


def test_covenant_run_gives_the_tools_their_class_nice_but_no_group(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    """`covenant run` keeps no CPU groups (it may run beside the home's daemon): nice only."""
    if os.geteuid() != 0:
        pytest.skip("process tools run only with agent uids and Landlock (a root process)")
    configure(daemon, ("fake", fake_model), extra="[rune]\nnice_small = 7\n")
    _agent(daemon, "smol", "small")
    fake_model.script(Reply.tools(ToolCall("probe", {})), Reply(text="done"))
    result = daemon.cli("run", str(daemon.home / "agents" / "smol"), "probe yourself")
    assert result.returncode == 0, result
    seen = json.loads([m for m in fake_model.requests[-1].messages if m["role"] == "tool"][-1]["content"])
    assert seen["nice"] == 7 and "covenant_" not in seen["cgroup"], seen
