"""The supervisorctl verbs against a real daemon: stop, start, restart, status AGENT, tail (issue 39 item 5)."""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from covenant.client import DaemonClient, RemoteError
from tests.daemon.conftest import DaemonProcess, agent_processes
from tests.daemon.test_daemon_e2e import audit_records, status, wait_for
from tests.fakes import FakeModelServer, Reply
from tests.processes import alive
from tests.rune.conftest import add_rune_agent, configure


def _gates(daemon: DaemonProcess) -> Path:
    """A folder the gate agent (running as an agent uid of its own) can see; ``open`` in it lets it answer."""
    gates = daemon.home.parent / "gates"
    gates.mkdir()
    gates.chmod(0o755)
    return gates


def _signed_dispatch(daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch, text: str, agent: str | None) -> RemoteError:
    """The daemon's error answer to a signed intent, read as a plain API client (no --home to word hints with)."""
    from covenant.policy.identities import load_user_identity
    from covenant.policy.signing import new_intent, sign_intent

    monkeypatch.setenv("XDG_CONFIG_HOME", daemon.env["XDG_CONFIG_HOME"])
    me = load_user_identity()
    intent = new_intent(text, issuer_display=me.display, issuer_pubkey=me.pubkey, agent=agent, priority="normal",
                        parent=None)
    with DaemonClient(daemon.socket, timeout=60) as client, pytest.raises(RemoteError) as refused:
        client.request("POST", "/v1/dispatch", {"intent": intent, "signature": sign_intent(me.key, intent)})
    return refused.value


def _start_hint(stderr: str) -> list[str]:
    """The command a refusal says starts the agent again, as words."""
    return shlex.split(stderr.split("started again with `")[1].split("`")[0])


def test_stop_refuses_new_dispatches_lets_one_in_flight_finish_and_survives_restarts(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    gates = _gates(daemon)
    daemon.add_agent("gate", "held_open.py", keywords=("gate",), cpu_ms=120_000)
    daemon.add_agent("wordcount", "echo.py", keywords=("count", "words"))
    daemon.add_agent("tally", "echo.py", keywords=("count",))
    daemon.start()
    running = daemon.cli_background("dispatch", f"gate {gates}", "--json")
    wait_for(lambda: [d["agent"] for d in status(daemon)["in_flight"]] == ["gate@local"], what="the gate agent running")

    stopped = daemon.cli("stop", "gate", check=True)
    assert stopped.stdout.startswith("stopped gate@local: new dispatches to it are refused (1 in flight, which will finish)")
    for args in (("dispatch", f"gate {gates}"), ("dispatch", "anything", "--agent", "gate")):
        refused = daemon.cli(*args)
        assert (refused.returncode, refused.stdout) == (6, ""), refused
        assert "agent gate@local is stopped" in refused.stderr
        assert _start_hint(refused.stderr) == [f"COVENANT_HOME={daemon.home}", "covenant", "start", "gate@local"]
    # Given with --home, the hint repeats it (the socket still from COVENANT_SOCKET).
    env = {k: v for k, v in daemon.env.items() if k != "COVENANT_HOME"}
    by_option = subprocess.run([sys.executable, "-m", "covenant", "--home", str(daemon.home), "dispatch", "x",
                                "--agent", "gate"], env=env, capture_output=True, text=True, timeout=60)
    assert by_option.returncode == 6
    assert _start_hint(by_option.stderr) == ["covenant", "--home", str(daemon.home), "start", "gate@local"]
    # To any other client: HTTP 409, code agent_stopped, the agent and the command in the details.
    answer = _signed_dispatch(daemon, monkeypatch, "open the gate", None)
    assert (answer.http_status, answer.code) == (409, "agent_stopped")
    assert answer.details == {"agent": "gate@local", "command": "start gate@local"}
    assert "`covenant start gate@local`" in answer.message

    shown = json.loads(daemon.cli("status", "gate", "--json", check=True).stdout)
    assert (shown["state"], shown["registry"], shown["stopped"]["by_uid"]) == ("stopped", "loaded", os.getuid())
    assert shown["file"] == str(daemon.home / "agents" / "gate" / "agent.toml") and len(shown["in_flight"]) == 1
    text = daemon.cli("status", "gate", check=True).stdout
    assert "state      STOPPED since" in text and "in flight  1" in text
    # The run that was in flight when the agent stopped finishes as it began.
    (gates / "open").write_text("")
    out, err = running.communicate(timeout=60)
    assert running.returncode == 0 and json.loads(out)["text"] == "opened", err

    # Keywords choose among the running agents; keywords that match only stopped ones say so.
    assert daemon.cli("stop", "wordcount", check=True).returncode == 0
    assert json.loads(daemon.cli("dispatch", "count words", "--json", check=True).stdout)["agent"] == "tally@local"
    only = daemon.cli("dispatch", "words please")
    assert only.returncode == 6
    assert "keywords match only stopped agents (wordcount@local): agent wordcount@local is stopped" in only.stderr
    assert status(daemon)["agents"]["stopped"] == ["gate@local", "wordcount@local"]
    assert "stopped until `covenant start`: gate@local, wordcount@local" in daemon.cli("status", check=True).stdout
    again = daemon.cli("stop", "wordcount", check=True).stdout
    assert again.startswith("wordcount@local was already stopped (since ")

    # A restart of the daemon keeps both stopped; so does removing an agent's folder and adding it back.
    assert daemon.stop() == 0
    daemon.start()
    assert daemon.cli("dispatch", "x", "--agent", "gate").returncode == 6
    saved = daemon.home.parent / "wordcount-saved"
    shutil.move(daemon.home / "agents" / "wordcount", saved)
    assert "removed: wordcount@local" in daemon.cli("reload", check=True).stdout
    gone = json.loads(daemon.cli("status", "wordcount", "--json", check=True).stdout)
    assert (gone["state"], gone["registry"], gone["file"]) == ("stopped", "removed", None)
    shutil.move(saved, daemon.home / "agents" / "wordcount")
    assert "added: wordcount@local" in daemon.cli("reload", check=True).stdout
    assert daemon.cli("dispatch", "words", "--agent", "wordcount@local").returncode == 6
    listed = json.loads(daemon.cli("agents", "list", "--json", check=True).stdout)
    assert {a["id"]: a["stopped"] for a in listed["agents"]} == {
        "gate@local": True, "tally@local": False, "wordcount@local": True}, listed

    started = daemon.cli("start", "gate", check=True)
    assert started.stdout.strip() == "started gate@local: it takes dispatches again"
    assert json.loads(daemon.cli("dispatch", f"gate {gates}", "--json", check=True).stdout)["text"] == "opened"
    daemon.cli("start", "wordcount@local", check=True)
    assert daemon.cli("dispatch", "words here", check=True).stdout.strip() == "words here"
    assert daemon.cli("start", "wordcount", check=True).stdout.strip() == "wordcount@local was not stopped: nothing to do"
    last = json.loads(daemon.cli("status", "wordcount", "--json", check=True).stdout)
    assert (last["state"], last["stopped"], last["last_dispatch"]["outcome"]) == ("loaded", None, "ok")

    # One event per change, with the admin peer's uid; the refused dispatches decided as agent_stopped.
    records = audit_records(daemon)
    changes = [(r["type"], r["data"]) for r in records if r["type"] in ("agent.stopped", "agent.started")]
    assert changes == [
        ("agent.stopped", {"agent": "gate@local", "peer_uid": os.getuid()}),
        ("agent.stopped", {"agent": "wordcount@local", "peer_uid": os.getuid()}),
        ("agent.started", {"agent": "gate@local", "peer_uid": os.getuid()}),
        ("agent.started", {"agent": "wordcount@local", "peer_uid": os.getuid()}),
    ]
    reasons = [r["data"].get("reason") for r in records if r["type"] == "policy.decision" and not r["data"]["allowed"]]
    assert reasons == ["agent_stopped"] * 7, reasons
    assert daemon.stop() == 0
    assert not agent_processes(daemon.home)


def test_unknown_names_odd_bytes_and_other_uids_are_refused(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.start()
    for verb in ("stop", "start", "restart", "status", "tail"):
        refused = daemon.cli(verb, "ehco")
        assert (refused.returncode, refused.stdout) == (6, ""), (verb, refused)
        assert "no agent with id 'ehco' is loaded (did you mean echo@local?" in refused.stderr, (verb, refused.stderr)
    for odd in ("a/b", "é\u202e", "../echo", "%2e"):
        refused = daemon.cli("stop", odd)
        assert refused.returncode == 6 and "no agent with id" in refused.stderr, (odd, refused)
    assert not (daemon.home / "state" / "stopped-agents.json").exists()

    os.chmod(daemon.socket, 0o666)  # let uid 65534 connect: the check under test is SO_PEERCRED, not the mode
    probe = r"""
import http.client, json, socket, os, sys
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])
os.setgid(65534); os.setuid(65534)
out = {}
for method, path in (("POST", "/v1/agents/echo/stop"), ("POST", "/v1/agents/echo/start"),
                     ("POST", "/v1/agents/echo/restart"), ("GET", "/v1/agents/echo/status")):
    c = C("localhost"); c.request(method, path); r = c.getresponse(); out[path] = [r.status, json.loads(r.read())]
print(json.dumps(out))
"""
    result = subprocess.run([sys.executable, "-I", "-c", probe, str(daemon.socket)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    for verb in ("stop", "start", "restart"):
        assert answers[f"/v1/agents/echo/{verb}"][0] == 403
        assert answers[f"/v1/agents/echo/{verb}"][1]["error"]["code"] == "forbidden"
    assert answers["/v1/agents/echo/status"][0] == 200 and answers["/v1/agents/echo/status"][1]["state"] == "loaded"
    assert daemon.cli("dispatch", "echo this", check=True).stdout.strip() == "echo this"  # not stopped by them
    assert not [r for r in audit_records(daemon) if r["type"] in ("agent.stopped", "agent.started")]


def _read_lines(proc: subprocess.Popen[bytes], count: int, timeout: float = 60) -> list[str]:
    """The next ``count`` lines ``proc`` prints, waiting at most ``timeout`` seconds in all (read from the pipe
    itself: a buffered reader may hold a second line that select() would then never report)."""
    assert proc.stdout is not None
    fd, seen = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while seen.count(b"\n") < count:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            proc.kill()
            raise AssertionError(f"{proc.args} printed only {seen!r} in {timeout} s: {proc.communicate()[1]!r}")
        chunk = os.read(fd, 65536)
        assert chunk, f"{proc.args} ended (exit {proc.wait()}) after {seen!r}"
        seen += chunk
    return seen.decode().splitlines()[:count]


def test_restart_lets_a_run_in_flight_finish_and_tail_shows_the_agents_stderr(daemon: DaemonProcess) -> None:
    gates = _gates(daemon)
    manifest = daemon.add_agent("gate", "held_open.py", keywords=("gate",), cpu_ms=120_000)
    daemon.add_agent("chatty", "chatty.py", keywords=("chat",))
    daemon.start()
    # Its last lines (none yet), then the new ones: the daemon's backlog and live feed leave no gap between them.
    follower = subprocess.Popen([sys.executable, "-m", "covenant", "tail", "gate", "-f", "--json"],
                                env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        running = daemon.cli_background("dispatch", f"gate {gates}", "--json")
        wait_for(lambda: [d["agent"] for d in status(daemon)["in_flight"]] == ["gate@local"], what="the gate running")
        followed = [json.loads(line) for line in _read_lines(follower, 2)]
        assert [e["msg"] for e in followed] == ["dispatch started", "agent stderr"], followed
        assert followed[1]["line"] == f"gate waiting for {gates / 'open'}" and followed[1]["agent"] == "gate@local"
    finally:
        follower.terminate()
        follower.wait(timeout=30)

    # Restart while the run is in flight: the file is read again now (its new keyword routes), the run goes on.
    manifest.write_text(manifest.read_text().replace('keywords = ["gate"]', 'keywords = ["gate", "door"]'))
    restarted = daemon.cli("restart", "gate", check=True)
    assert restarted.stdout.startswith(f"reloaded gate@local from {manifest} (1 in flight, which will finish as it began)")
    assert [d["agent"] for d in status(daemon)["in_flight"]] == ["gate@local"]
    (gates / "open").write_text("")
    out, err = running.communicate(timeout=60)
    assert running.returncode == 0 and json.loads(out)["text"] == "opened", err
    assert json.loads(daemon.cli("dispatch", f"door {gates}", "--json", check=True).stdout)["agent"] == "gate@local"
    reasons = [r["data"]["reason"] for r in audit_records(daemon) if r["type"] == "registry.loaded"]
    assert reasons == ["start", "restart"]

    # A stopped agent is not restarted behind the operator's back.
    daemon.cli("stop", "gate", check=True)
    refused = daemon.cli("restart", "gate")
    assert refused.returncode == 6 and "restart refused: agent gate@local is stopped" in refused.stderr

    # tail: the lines `logs --agent` shows, the last 10 by default, -n N of them.
    for _ in range(3):
        daemon.cli("dispatch", "chat", check=True)
    logs = daemon.cli("logs", "--agent", "chatty", check=True).stdout.splitlines()
    assert len(logs) == 12 and sum("chatty: still here" in line for line in logs) == 3
    assert daemon.cli("tail", "chatty", check=True).stdout.splitlines() == logs[-10:]
    assert daemon.cli("tail", "chatty", "-n", "2", check=True).stdout.splitlines() == logs[-2:]
    assert daemon.cli("tail", "chatty", "-n", "0", check=True).stdout == ""
    bad = daemon.cli("tail", "chatty", "-n", "-1")
    assert bad.returncode == 2 and bad.stdout == ""


def test_stopping_a_rune_agent_drains_and_stops_its_replica_and_start_brings_it_back(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    configure(daemon, ("fake", fake_model), extra='[rune]\nstart = "eager"\n')
    add_rune_agent(daemon, toolset=())
    daemon.start()

    def replica() -> dict | None:
        return json.loads(daemon.cli("status", "chat", "--json", check=True).stdout)["replica"]

    wait_for(lambda: (replica() or {}).get("state") == "ready", what="the eager replica")
    first_pid = replica()["pid"]  # type: ignore[index]
    resume = threading.Event()
    fake_model.script(Reply(text="finished after the stop", pause_after_events=1, resume=resume))
    running = daemon.cli_background("dispatch", "hello", "--agent", "chat", "--stream")
    try:
        fake_model.wait_for_requests(1)  # the intent is on the replica, its answer held by the fake
        stopped = json.loads(daemon.cli("stop", "chat", "--json", check=True).stdout)
        assert stopped["changed"] and stopped["state"] == "stopped" and len(stopped["in_flight"]) == 1
        assert daemon.cli("dispatch", "again", "--agent", "chat").returncode == 6
        assert alive(first_pid) and replica()["state"] in ("ready", "stopping")  # type: ignore[index]
        resume.set()
        out, err = running.communicate(timeout=60)
    finally:
        resume.set()
        if running.poll() is None:
            running.kill()
            running.wait()
    assert running.returncode == 0 and out == "finished after the stop\n", err
    wait_for(lambda: replica() is None, what="the replica to stop once drained, and go")
    wait_for(lambda: not alive(first_pid), what="the replica process to end")

    # An eager daemon starts no replica for a stopped agent; start brings one up at once.
    assert daemon.stop() == 0
    daemon.start()
    assert replica() is None and not [r for r in status(daemon)["replicas"] if r["agent"] == "chat@local"]
    daemon.cli("start", "chat", check=True)
    wait_for(lambda: (replica() or {}).get("state") == "ready", what="the replica after start")
    fake_model.script(Reply(text="back"))
    assert daemon.cli("dispatch", "hi", "--agent", "chat", check=True).stdout.strip() == "back"


def test_a_damaged_list_of_stopped_agents_stops_the_daemon_at_start_naming_it(daemon: DaemonProcess) -> None:
    """Fail closed: a file that is not covenant's would otherwise start agents an operator stopped."""
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    state = daemon.home / "state"
    state.mkdir(exist_ok=True)
    (state / "stopped-agents.json").write_text('{"agents": {"echo@local": "yes"}}')
    started = subprocess.run([sys.executable, "-m", "covenant", "daemon"], env=daemon.env, capture_output=True,
                             text=True, timeout=120)
    assert started.returncode == 2, started.stderr
    assert f"{state / 'stopped-agents.json'}: not a covenant list of stopped agents" in started.stderr
    assert not daemon.socket.exists() and not agent_processes(daemon.home)
