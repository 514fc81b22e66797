"""End to end: a real daemon process, the real CLI, real agents, real signals."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from covenant.client import DaemonClient
from covenant.runtime.records import DispatchStore
from tests.daemon.conftest import DaemonProcess, agent_processes
from tests.processes import wait_gone


def audit_records(d: DaemonProcess) -> list[dict]:
    result = d.cli("audit", "tail", "--json", "-n", "1000000", check=True)
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def wait_for(predicate, timeout: float = 60, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def status(d: DaemonProcess) -> dict:
    return d.api("GET", "/v1/status")  # type: ignore[return-value]


def slow_dispatches_in_flight(d: DaemonProcess, count: int, seconds: int) -> list[subprocess.Popen[str]]:
    """Start ``count`` CLI dispatches of the slow agent and wait until all of them run."""
    clients = [d.cli_background("dispatch", f"sleep {seconds}", "--json") for _ in range(count)]
    wait_for(lambda: len(status(d)["in_flight"]) == count, what=f"{count} in flight")
    return clients


def assert_cancelled(clients: list[subprocess.Popen[str]]) -> None:
    for proc in clients:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 5
        assert json.loads(out)["outcome"] == "cancelled"


def test_denied_until_granted_then_audited(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",), required=("tool.echo",))
    daemon.start()

    denied = daemon.cli("dispatch", "echo hello")
    assert denied.returncode == 3, denied.stderr
    assert "tool.echo" in denied.stderr
    assert "covenant grant tester@test tool.echo" in denied.stderr
    assert not agent_processes(daemon.home)

    daemon.cli("grant", "tester@test", "tool.echo", check=True)
    allowed = daemon.cli("dispatch", "echo hello")
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.strip() == "echo hello"

    as_json = json.loads(daemon.cli("dispatch", "echo again", "--json", check=True).stdout)
    assert as_json["outcome"] == "ok" and as_json["agent"] == "echo@local"
    assert as_json["record"]["intent_id"] == as_json["intent_id"]

    os.chmod(daemon.home / "state", 0o700)
    history = daemon.cli("history", "--json", check=True)
    assert as_json["intent_id"] in history.stdout
    shown = json.loads(daemon.cli("show", as_json["intent_id"], "--json", check=True).stdout)
    assert shown["outcome"] == "ok" and shown["agent_id"] == "echo@local"

    assert daemon.stop() == 0
    verify = daemon.cli("audit", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    records = audit_records(daemon)
    types = [r["type"] for r in records]
    for expected in ("daemon.start", "registry.loaded", "intent.received", "policy.decision", "agent.spawned",
                     "agent.exited", "intent.completed", "grant.added", "daemon.stop"):
        assert expected in types, expected
    decisions = [r["data"] for r in records if r["type"] == "policy.decision"]
    assert decisions[0]["allowed"] is False and decisions[0]["missing"] == ["tool.echo"]
    assert decisions[0]["reason"] == "capability_denied"
    assert decisions[-1]["allowed"] is True
    completed = [r["data"] for r in records if r["type"] == "intent.completed"]
    assert {c["intent"] for c in completed} >= {as_json["intent_id"]}


def test_routing_ambiguous_no_match_and_explicit(daemon: DaemonProcess) -> None:
    daemon.add_agent("one", "echo.py", keywords=("shared", "alpha"))
    daemon.add_agent("two", "echo.py", keywords=("shared", "beta"))
    daemon.start()
    ambiguous = daemon.cli("dispatch", "shared work")
    assert ambiguous.returncode == 6
    assert "one@local" in ambiguous.stderr and "two@local" in ambiguous.stderr
    no_match = daemon.cli("dispatch", "nothing matches here")
    assert no_match.returncode == 6 and "default_agent" in no_match.stderr
    routed = daemon.cli("dispatch", "alpha shared")
    assert routed.returncode == 0 and routed.stdout.strip() == "alpha shared"
    explicit = daemon.cli("dispatch", "shared work", "--agent", "two@local")
    assert explicit.returncode == 0
    unknown = daemon.cli("dispatch", "x", "--agent", "nope@local")
    assert unknown.returncode == 6


def test_dry_run_spawns_nothing(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",), required=("tool.echo",))
    daemon.start()
    denied = daemon.cli("dispatch", "echo x", "--dry-run")
    assert denied.returncode == 3
    daemon.cli("grant", "tester@test", "tool.echo", check=True)
    allowed = daemon.cli("dispatch", "echo x", "--dry-run")
    assert allowed.returncode == 0, allowed.stderr
    assert "would dispatch to echo@local" in allowed.stdout
    assert daemon.api("GET", "/v1/dispatches?limit=10") == {"dispatches": []}


def test_fifty_concurrent_cli_dispatches(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.start()
    procs = [
        daemon.cli_background("dispatch", f"echo number {i}", "--json")
        for i in range(50)
    ]
    intent_ids = set()
    for i, proc in enumerate(procs):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        doc = json.loads(out)
        assert doc["text"] == f"echo number {i}"
        intent_ids.add(doc["intent_id"])
    assert len(intent_ids) == 50
    assert daemon.stop() == 0
    completed = [r["data"]["intent"] for r in audit_records(daemon) if r["type"] == "intent.completed"]
    assert sorted(completed) == sorted(intent_ids)  # each exactly once
    assert daemon.cli("audit", "verify").returncode == 0


def test_full_queue_answers_overloaded(daemon: DaemonProcess) -> None:
    daemon.start_with_one_slot()
    background = [
        daemon.cli_background("dispatch", "sleep 3")
        for _ in range(2)
    ]
    wait_for(lambda: len(status(daemon)["in_flight"]) == 1 and status(daemon)["queued"] == 1, what="1 running + 1 queued")
    refused = daemon.cli("dispatch", "sleep 0", "--json")
    assert refused.returncode == 5
    assert "saturated" in refused.stderr
    for proc in background:
        proc.communicate(timeout=120)
        assert proc.returncode == 0
    with DaemonClient(daemon.socket) as client:
        metrics = client._send("GET", "/metrics").read().decode()
    assert 'covenant_http_refused_total{code="503",listener="control"} 1.0' in metrics
    assert 'covenant_policy_denials_total{reason="overloaded"} 1.0' in metrics


def test_sighup_adds_new_manifest_and_keeps_a_broken_ones_last_valid_version(daemon: DaemonProcess) -> None:
    first = daemon.add_agent("first", "echo.py", keywords=("first",))
    daemon.start()
    daemon.add_agent("second", "echo.py", keywords=("second",))
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGHUP)
    wait_for(lambda: "second@local" in status(daemon)["agents"]["loaded"], what="second agent loaded")
    assert daemon.cli("dispatch", "second go").returncode == 0

    first.write_text(first.read_text().replace('version = "0.1.0"', 'version = '))  # broken TOML
    daemon.process.send_signal(signal.SIGHUP)
    wait_for(lambda: "first@local" in status(daemon)["agents"]["snapshot"], what="first on its snapshot")
    assert status(daemon)["agents"]["snapshot"] == {"first@local": str(first)}
    assert any("first" in p["path"] for p in status(daemon)["rejected"])
    ran = daemon.cli("dispatch", "first go", "--agent", "first@local")
    assert ran.returncode == 0 and ran.stdout.strip() == "first go", ran.stdout + ran.stderr
    listed = json.loads(daemon.cli("agents", "list", "--json", check=True).stdout)
    assert {a["id"]: a["state"] for a in listed["agents"]} == {"first@local": "snapshot", "second@local": "loaded"}
    reloads = [r["data"] for r in audit_records(daemon) if r["type"] == "registry.loaded"]
    assert reloads[-1]["withdrawn"] == [] and reloads[-1]["rejected"] == 1
    assert reloads[-1]["snapshot"] == {"first@local": str(first)}

def test_reload_through_socket(daemon: DaemonProcess) -> None:
    daemon.start()
    daemon.add_agent("late", "echo.py", keywords=("late",))
    result = daemon.cli("reload", check=True)
    assert "late@local" in result.stdout


def test_sigterm_drains_slow_dispatches(daemon: DaemonProcess) -> None:
    daemon.write_config("""
        [daemon]
        max_concurrent = 16
    """)
    daemon.add_agent("slow", "slow.py", keywords=("sleep",))
    daemon.start()
    clients = slow_dispatches_in_flight(daemon, 10, 2)
    assert daemon.stop(signal.SIGTERM) == 0
    for proc in clients:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert json.loads(out)["text"] == "slept 2.0"
    assert not agent_processes(daemon.home)
    assert not daemon.socket.exists()


def test_sigterm_with_short_drain_cancels(daemon: DaemonProcess) -> None:
    daemon.add_agent("slow", "slow.py", keywords=("sleep",))
    daemon.start("--drain-timeout", "0.5")
    clients = slow_dispatches_in_flight(daemon, 3, 600)
    assert daemon.stop(signal.SIGTERM) == 5
    assert_cancelled(clients)
    assert not agent_processes(daemon.home)
    assert daemon.cli("audit", "verify").returncode == 0


def test_sigkill_during_burst_then_restart_and_verify(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.start()
    clients = [
        daemon.cli_background("dispatch", f"echo {i}", "--json")
        for i in range(30)
    ]
    wait_for(lambda: any(p.poll() == 0 for p in clients), what="a first acknowledged dispatch")
    writer = status(daemon)["audit"]["writer_pid"]
    daemon.stop(signal.SIGKILL)
    acknowledged = []
    for proc in clients:
        out, _ = proc.communicate(timeout=60)
        if proc.returncode == 0:
            acknowledged.append(json.loads(out)["intent_id"])
    assert acknowledged, "some dispatches completed before the kill"
    wait_for(lambda: not agent_processes(daemon.home), timeout=30, what="agents to die with the daemon")
    assert wait_gone(writer, 10), "the audit writer outlived its daemon"
    daemon.start()
    assert daemon.stop() == 0
    verify = daemon.cli("audit", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    completed = {r["data"]["intent"] for r in audit_records(daemon) if r["type"] == "intent.completed"}
    assert set(acknowledged) <= completed
    store = DispatchStore(daemon.home / "state" / "dispatches")  # committed with intent.completed
    assert all(store.get(intent) is not None for intent in acknowledged)


def test_other_uid_cannot_reload_but_can_read_status(daemon: DaemonProcess) -> None:
    daemon.start()
    os.chmod(daemon.socket, 0o666)  # let uid 65534 connect: the check under test is SO_PEERCRED, not the mode
    probe = r"""
import http.client, json, os, socket, sys
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])
os.setgid(65534); os.setuid(65534)
out = {}
for method, path in (("POST", "/v1/reload"), ("GET", "/v1/status")):
    c = C("localhost"); c.request(method, path); r = c.getresponse(); out[path] = [r.status, json.loads(r.read())]
print(json.dumps(out))
"""
    result = subprocess.run([sys.executable, "-I", "-c", probe, str(daemon.socket)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    assert answers["/v1/reload"][0] == 403
    assert answers["/v1/reload"][1]["error"]["code"] == "forbidden"
    assert answers["/v1/status"][0] == 200
    assert daemon.cli("reload").returncode == 0  # root may


def test_status_exit_codes(daemon: DaemonProcess) -> None:
    down = daemon.cli("status")
    assert down.returncode == 5
    assert "covenant daemon" in down.stderr
    daemon.start()
    up = daemon.cli("status", "--json")
    assert up.returncode == 0
    doc = json.loads(up.stdout)
    assert doc["audit"]["healthy"] is True
    assert doc["audit"]["head_seq"] >= 2 and doc["audit"]["checkpoint_age_ms"] >= 0
    writer = doc["audit"]["writer_pid"]
    assert b"covenant.audit.writer_process" in Path(f"/proc/{writer}/cmdline").read_bytes()
    assert doc["network_isolation"] is True  # root on Linux: unshare -n works
    assert doc["sockets"] == [str(daemon.socket)]
    dispatch_down = DaemonProcess(home=daemon.home, socket=Path("/nonexistent/x.sock"),
                                  env={**daemon.env, "COVENANT_SOCKET": "/nonexistent/x.sock"})
    assert dispatch_down.cli("dispatch", "hello").returncode == 5


def test_status_says_when_every_agent_shares_one_account(daemon: DaemonProcess) -> None:
    if os.geteuid() != 0:
        pytest.skip("only a root daemon runs agents as another account")
    daemon.write_config('[isolation]\nuser = "nobody"\n')
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.start()
    nobody = pwd.getpwnam("nobody").pw_uid
    said = f"isolation  uid: every agent runs as uid {nobody} ([isolation] user), one account shared by all agents"
    assert said in daemon.cli("status", check=True).stdout
    done = daemon.cli("dispatch", "echo hello", "--agent", "echo@local", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["record"]["uid"] == nobody
    assert daemon.stop() == 0


@pytest.mark.parametrize("count", [200])
def test_many_dispatches_from_one_async_client(daemon: DaemonProcess, count: int) -> None:
    daemon.write_config("""
        [daemon]
        queue_max = 1000
    """)
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.start()
    script = Path(__file__).parent / "async_burst.py"
    result = subprocess.run([sys.executable, str(script), str(daemon.socket), str(count)],
                            env=daemon.env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    ids = json.loads(result.stdout)
    assert len(set(ids)) == count
    assert daemon.stop() == 0
    completed = [r["data"]["intent"] for r in audit_records(daemon) if r["type"] == "intent.completed"]
    assert sorted(completed) == sorted(ids)


def test_dispatch_to_each_example_agent(daemon: DaemonProcess, built_examples: Path) -> None:
    from tests.conftest import require_tool

    require_tool("node")
    daemon.write_config(f'agents_dir = "{built_examples}"\n')
    daemon.start()
    loaded = status(daemon)["agents"]["loaded"]
    assert {"wordcount@local", "calc@local", "search@local"} <= set(loaded), status(daemon)["rejected"]
    daemon.cli("grant", "tester@test", "tool.text_stats", "tool.calculate", "tool.search_files", check=True)
    cases = {
        "wordcount@local": ("count the words in this short sentence", "words: 7"),
        "calc@local": ("calculate (2 + 3) * 7", "35"),
        "search@local": ("search for signed checkpoints", "audit.md"),
    }
    for agent, (text, expected) in cases.items():
        doc = json.loads(daemon.cli("dispatch", text, "--json", check=True).stdout)
        assert doc["agent"] == agent and doc["outcome"] == "ok", doc
        assert expected in doc["text"] + " ".join(doc["sources"]), doc
    error = daemon.cli("dispatch", "calculate 1 / 0")
    assert error.returncode == 1  # the agent answered status: error
    assert daemon.stop() == 0
    assert daemon.cli("audit", "verify").returncode == 0


def test_second_sigterm_cancels_at_once_and_sighup_during_drain_is_ignored(daemon: DaemonProcess) -> None:
    daemon.add_agent("slow", "slow.py", keywords=("sleep",))
    daemon.start("--drain-timeout", "600")
    clients = slow_dispatches_in_flight(daemon, 2, 600)
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGTERM)
    wait_for(lambda: status(daemon)["shutting_down"], what="draining")
    daemon.process.send_signal(signal.SIGHUP)  # must not end the drain
    time.sleep(0.5)
    assert daemon.process.poll() is None and len(status(daemon)["in_flight"]) == 2
    refused = daemon.cli("dispatch", "sleep 1")
    assert refused.returncode == 5 and "shutting down" in refused.stderr
    assert daemon.stop(signal.SIGTERM, timeout=60) == 5  # far inside the 600 s drain timeout
    assert_cancelled(clients)
    assert not agent_processes(daemon.home)


def test_budget_exhausted_survives_a_restart(daemon: DaemonProcess) -> None:
    daemon.add_agent("metered", "echo.py", keywords=("metered",),
                     extra="\n[settlement]\nbudget_credits_per_hour = 1\n")
    daemon.start()
    first = json.loads(daemon.cli("dispatch", "metered one", "--json", check=True).stdout)
    assert first["record"]["cpu_ms"] >= 1  # a python3 start costs well over 1 ms of CPU
    denied = daemon.cli("dispatch", "metered two")
    assert denied.returncode == 3 and "budget" in denied.stderr
    assert daemon.stop() == 0
    daemon.start()  # the ledger is rebuilt from the dispatch records of the last hour
    again = daemon.cli("dispatch", "metered three", "--json")
    assert again.returncode == 3
    assert "budget" in again.stderr
    decisions = [r["data"] for r in audit_records(daemon) if r["type"] == "policy.decision"]
    assert decisions[-1]["reason"] == "budget_exhausted"
