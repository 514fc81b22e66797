"""Agents written to misbehave, dispatched through a real root daemon (issue 12's acceptance).

Every case asserts two things: the attempt failed, and the dispatch itself
still ran (outcome ok, the agent's report in hand). The agents are real
python3 programs on /usr/bin/python3 running as their own uid.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.daemon.test_daemon_e2e import audit_records, status, wait_for
from tests.processes import alive
from tests.security.conftest import DISK_MB, MAX_PROCESSES, AttackedDaemon, processes_of_uid


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_agents_run_as_their_own_uid_and_status_says_so(attacked: AttackedDaemon) -> None:
    attacked.start()
    doc = status(attacked)
    assert doc["isolation"] == "uid" and doc["isolation_detail"]["problems"] == []
    outcome, report = attacked.attack("read", "/etc/hostname")
    record = outcome["record"]
    assert record["isolation"] == "uid" and record["uid"] == report["uid"]
    assert attacked.uid_range[0] <= report["uid"] <= attacked.uid_range[1] and report["uid"] != os.getuid()
    # Limits are set while the exec helper is still covenant's (it lacks CAP_SYS_RESOURCE for other uids).
    assert report["rlimits"]["RLIMIT_NPROC"] == [MAX_PROCESSES, MAX_PROCESSES]
    assert report["rlimits"]["RLIMIT_FSIZE"] == [DISK_MB << 20, DISK_MB << 20]
    assert report["rlimits"]["RLIMIT_CORE"] == [0, 0] and report["rlimits"]["RLIMIT_CPU"][0] == 61
    assert "cannot set rlimit" not in attacked.log()
    text = attacked.cli("status", check=True).stdout
    assert "isolation  uid" in text


DAEMON_FILES = (
    "identity/daemon.key",
    "grants.toml",
    "identities.toml",
    "covenant.toml",
    "audit/audit-000000.jsonl",
    "state/isolation/uids.json",
)


def test_reading_the_daemons_files_fails(attacked: AttackedDaemon) -> None:
    # One daemon for every file: a read that fails changes nothing the next attempt depends on.
    (attacked.home / "identities.toml").touch(exist_ok=True)
    attacked.start()
    for target in DAEMON_FILES:
        _, report = attacked.attack("read", str(attacked.home / target))
        assert report["succeeded"] is False and report["errno"] == errno.EACCES, (target, report)


def test_reading_another_users_identity_key_fails(attacked: AttackedDaemon) -> None:
    # Alice's key in a config dir anyone may traverse: only the key's own 0600 protects it.
    alice = attacked.home.parent / "alice"
    attacked.cli("identity", "init", "--display", "alice@test", env={"XDG_CONFIG_HOME": str(alice)}, check=True)
    key = alice / "covenant" / "identity.key"
    for folder in (alice, key.parent):
        folder.chmod(0o755)
    assert key.stat().st_mode & 0o777 == 0o600
    attacked.start()
    _, report = attacked.attack("read", str(key))
    assert report["succeeded"] is False and report["errno"] == errno.EACCES, report


def test_writing_the_audit_log_fails_and_it_still_verifies(attacked: AttackedDaemon) -> None:
    attacked.start()
    segment = attacked.home / "audit" / "audit-000000.jsonl"
    _, report = attacked.attack("write", str(segment))
    assert report["succeeded"] is False and report["errno"] == errno.EACCES, report
    assert b"tampered" not in segment.read_bytes()
    assert attacked.cli("audit", "verify").returncode == 0


def test_writing_the_agents_dir_fails(attacked: AttackedDaemon) -> None:
    attacked.start()
    own_script = attacked.home / "agents" / "attacker" / "attacker.py"
    before = sha256(own_script)
    _, planted = attacked.attack("create", str(attacked.home / "agents"))
    _, rewritten = attacked.attack("write", str(own_script))
    assert planted["succeeded"] is False and planted["errno"] == errno.EACCES, planted
    assert rewritten["succeeded"] is False and rewritten["errno"] == errno.EACCES, rewritten
    assert not (attacked.home / "agents" / "planted.toml").exists() and sha256(own_script) == before


@pytest.mark.parametrize("agent", ["attacker@local", "attacker-offline@local"])
def test_no_agent_reaches_the_control_socket(attacked: AttackedDaemon, agent: str) -> None:
    attacked.start()
    sock = attacked.home / "run" / "covenant.sock"
    assert sock.exists() and (sock.stat().st_mode & 0o777) == 0o660
    assert (sock.parent.stat().st_mode & 0o777) == 0o750
    _, report = attacked.attack("socket", str(sock), agent=agent)
    assert report["succeeded"] is False, report
    assert str(sock) in report["tried"]
    # The daemon listens on no abstract socket an agent sharing the host's network could try.
    daemon_inodes = {os.readlink(f"/proc/{attacked.process.pid}/fd/{fd}")  # type: ignore[union-attr]
                     for fd in os.listdir(f"/proc/{attacked.process.pid}/fd")}  # type: ignore[union-attr]
    with open("/proc/net/unix") as f:
        abstract = [line.split() for line in f if len(line.split()) >= 8 and line.split()[7].startswith("@")]
    assert not [row for row in abstract if f"socket:[{row[6]}]" in daemon_inodes]


@pytest.mark.parametrize("attack", ["environ", "mem"])
def test_reading_the_daemons_memory_and_environment_fails(attacked: AttackedDaemon, attack: str) -> None:
    attacked.start()
    _, report = attacked.attack(attack)
    assert report["succeeded"] is False and report["errno"] == errno.EACCES, report


def test_signalling_the_daemon_fails(attacked: AttackedDaemon) -> None:
    attacked.start()
    _, report = attacked.attack("signal")
    assert report["succeeded"] is False and report["errno"] == errno.EPERM, report
    assert attacked.process is not None and attacked.process.poll() is None
    assert status(attacked)["shutting_down"] is False


def test_the_audit_writer_process_is_out_of_reach(attacked: AttackedDaemon) -> None:
    """It holds the signing key in memory: an agent can neither read it nor kill the writer."""
    attacked.start()
    writer = status(attacked)["audit"]["writer_pid"]
    _, report = attacked.attack("writer", str(writer))
    assert report["succeeded"] is False, report
    assert report["mem"]["errno"] == errno.EACCES and report["environ"]["errno"] == errno.EACCES, report
    assert report["kill"]["errno"] == errno.EPERM, report
    audit = status(attacked)["audit"]
    assert audit["writer_pid"] == writer and audit["healthy"] is True


def test_a_fork_bomb_stops_at_the_uid_process_limit_and_leaves_nothing(attacked: AttackedDaemon) -> None:
    attacked.start()
    outcome, report = attacked.attack("forkbomb")
    assert report["succeeded"] is False and report["errno"] == errno.EAGAIN, report
    assert report["forked"] < MAX_PROCESSES
    wait_for(lambda: not processes_of_uid(report["uid"]), timeout=10, what="the bomb's processes to be gone")


def test_a_dev_shm_filler_is_capped_counted_and_cleaned(attacked: AttackedDaemon) -> None:
    attacked.start()
    before = os.statvfs("/dev/shm")
    done = attacked.cli("dispatch", "attack shm 300", "--agent", "attacker@local", "--json", timeout=180)
    outcome = json.loads(done.stdout)
    # Capped by the kernel, and the run that filled it ends disk_exceeded (exit 4); its report is on stderr.
    assert done.returncode == 4 and outcome["outcome"] == "disk_exceeded", outcome
    assert "filled its private /tmp or /dev/shm" in outcome["error"], outcome["error"]
    report = json.loads(outcome["record"]["stderr_tail"].splitlines()[-1].removeprefix("report "))
    assert report["succeeded"] is False and report["errno"] in (errno.ENOSPC, errno.EFBIG), report
    assert report["written"] <= DISK_MB * 1024 * 1024
    assert outcome["record"]["scratch_peak_bytes"] >= report["written"]  # counted as the dispatch's disk use
    assert not [e for e in os.scandir("/dev/shm") if e.stat(follow_symlinks=False).st_uid == report["uid"]]
    after = os.statvfs("/dev/shm")
    assert (before.f_bfree - after.f_bfree) * after.f_frsize < 4 * 1024 * 1024  # the host's /dev/shm untouched
    _, again = attacked.attack("read", "/etc/hostname")  # the next run finds its /dev/shm empty again
    assert again["succeeded"] is True


def test_a_setsid_grandchild_with_an_empty_environment_is_gone_within_3_s(attacked: AttackedDaemon) -> None:
    attacked.start()
    writer = status(attacked)["audit"]["writer_pid"]
    outcome, report = attacked.attack("escape")
    ended = time.monotonic()
    pid = report["pid"]
    while alive(pid) and time.monotonic() - ended < 3:
        time.sleep(0.02)
    assert not alive(pid), f"escaped grandchild {pid} outlived its dispatch by 3 s"
    # …and is reaped, not left a zombie: covenant adopted it (child subreaper), so only covenant can.
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=3, what=f"the escaped grandchild {pid} reaped")
    assert not processes_of_uid(report["uid"])
    assert status(attacked)["audit"]["writer_pid"] == writer  # the sweep spared covenant's own child
    assert outcome["record"]["left_behind"] >= 1, "the escape is on the record"
    exited = [r["data"] for r in audit_records(attacked) if r["type"] == "agent.exited"]
    assert exited[-1]["intent"] == outcome["intent_id"] and exited[-1]["left_behind"] == outcome["record"]["left_behind"]
    shown = attacked.cli("show", outcome["intent_id"], check=True).stdout
    assert f"left  {outcome['record']['left_behind']} processes still running after the agent ended, killed" in shown


def test_after_kill_9_of_the_daemon_the_next_start_sweeps_survivors(attacked: AttackedDaemon) -> None:
    drop = attacked.home.parent / "drop"
    drop.mkdir()
    drop.chmod(0o777)
    attacked.start()
    client = attacked.cli_background("dispatch", f"attack escape-and-wait {drop}", "--agent", "attacker@local", "--json")
    pid_file = drop / "escaped.pid"
    wait_for(pid_file.exists, timeout=60, what="the escaped grandchild")
    wait_for(lambda: pid_file.read_text().strip().isdigit(), timeout=10, what="its pid")
    escaped = int(pid_file.read_text())
    assert attacked.process is not None
    attacked.process.send_signal(signal.SIGKILL)
    attacked.process.wait()
    client.communicate(timeout=60)
    time.sleep(0.5)
    assert alive(escaped), "the escape must survive the daemon's death for this test to mean anything"
    attacked.start()  # returns once the daemon answers: it swept before serving
    restarted = time.monotonic()
    while alive(escaped) and time.monotonic() - restarted < 10:
        time.sleep(0.05)
    assert not alive(escaped)
    sweeps = [r for r in audit_records(attacked) if r["type"] == "isolation.sweep"]
    assert sweeps and escaped in sweeps[-1]["data"]["pids"] and sweeps[-1]["data"]["survivors"] == []
    _, report = attacked.attack("read", "/etc/hostname")
    assert report["succeeded"] is True
