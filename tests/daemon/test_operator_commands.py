"""Operator-facing commands against a real daemon: what they read, print and exit with (issue 16)."""

from __future__ import annotations

import http.client
import json
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonProcess
from tests.daemon.test_daemon_e2e import audit_records


def test_agents_check_reads_the_files_not_the_daemon(daemon: DaemonProcess) -> None:
    daemon.add_agent("good", "echo.py", keywords=("good",))
    daemon.start()
    # Written after the daemon loaded its registry, and never reloaded: only the files know it.
    broken = daemon.home / "agents" / "broken.toml"
    broken.write_text("[agent\n")
    result = daemon.cli("agents", "check")
    assert result.returncode == 1, result.stderr
    assert str(broken) in result.stdout
    assert "2 manifest(s): 1 valid, 1 rejected" in result.stderr
    as_json = json.loads(daemon.cli("agents", "check", "--json").stdout)
    assert as_json["valid"] is False and as_json["agents"] == ["good@local"]


def test_a_rejected_edit_keeps_the_whole_previous_package_running_from_its_snapshot(daemon: DaemonProcess) -> None:
    """Issue 39 item 1: a typo never takes a working agent offline, and never runs the old manifest over the
    edited code: the agent runs its last valid package, copied when it loaded, until the file loads again."""
    manifest = daemon.add_agent("first", "echo.py", keywords=("first",))
    daemon.start()
    assert daemon.cli("dispatch", "first go").stdout.strip() == "first go"
    # An edit of the code and a broken manifest, as one careless change.
    (manifest.parent / "echo.py").write_text(
        "import json, sys\n"
        "intent = json.loads(sys.stdin.readline())\n"
        'print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": "edited", "sources": []}))\n'
    )
    manifest.write_text(manifest.read_text().replace("cpu_ms_per_task = 30000", 'cpu_ms_per_task = "lots"'))

    reloaded = daemon.cli("reload")
    assert reloaded.returncode == 1, reloaded.stdout + reloaded.stderr
    assert f"rejected: {manifest}" in reloaded.stdout and "snapshot: first@local" in reloaded.stdout
    assert "withdrawn" not in reloaded.stdout
    assert "1 manifest(s) rejected, every other manifest reloaded" in reloaded.stderr
    doc = json.loads(daemon.cli("reload", "--json").stdout)
    assert doc["rejected"] == [str(manifest)] and doc["withdrawn"] == [] and "first@local" in doc["agents"]
    assert doc["snapshot"] == []  # reported once, when the agent moved to its snapshot

    def runs_the_old_version() -> None:
        ran = daemon.cli("dispatch", "first go")  # routed by keyword, as before the edit
        assert ran.returncode == 0 and ran.stdout.strip() == "first go", ran.stdout + ran.stderr
        agents = json.loads(daemon.cli("agents", "list", "--json", check=True).stdout)["agents"]
        [first] = [a for a in agents if a["id"] == "first@local"]
        assert first["state"] == "snapshot" and first["waiting_on"] == str(manifest), first
        assert first["root"].startswith(str(daemon.home / "state" / "snapshots")), first
        status = json.loads(daemon.cli("status", "--json", check=True).stdout)
        assert status["agents"]["snapshot"] == {"first@local": str(manifest)}
        assert f"first@local runs its last valid version (snapshot) until {manifest} loads again" in \
            daemon.cli("status", check=True).stdout

    runs_the_old_version()
    registry = [r["data"] for r in audit_records(daemon) if r["type"] == "registry.loaded"]
    assert registry[-1]["snapshot"] == {"first@local": str(manifest)} and registry[-1]["withdrawn"] == []

    # A restart gives the same answer: the snapshot is kept under state/.
    assert daemon.stop() == 0
    daemon.start()
    runs_the_old_version()

    manifest.write_text(manifest.read_text().replace('cpu_ms_per_task = "lots"', "cpu_ms_per_task = 30000"))
    fixed = daemon.cli("reload")
    assert fixed.returncode == 0 and "changed: first@local" in fixed.stdout, fixed.stdout
    ran = daemon.cli("dispatch", "first go")
    assert ran.stdout.strip() == "edited", ran.stderr
    agents = json.loads(daemon.cli("agents", "list", "--json", check=True).stdout)["agents"]
    assert [a["state"] for a in agents if a["id"] == "first@local"] == ["loaded"]
    # Only the snapshot of what is loaded now is kept.
    kept = [p for p in (daemon.home / "state" / "snapshots").iterdir() if p.is_dir()]
    assert len(kept) == 1 and (kept[0] / "files" / "echo.py").read_text().count("edited") == 1


def test_a_rejected_edit_without_a_snapshot_withdraws_the_agent(daemon: DaemonProcess) -> None:
    """With no snapshot (the folder removed, or a package over the snapshot limits) a rejected edit withdraws
    the agent: never the old manifest over new code."""
    manifest = daemon.add_agent("first", "echo.py", keywords=("first",))
    daemon.start()
    assert daemon.cli("dispatch", "first go").returncode == 0
    shutil.rmtree(daemon.home / "state" / "snapshots")
    manifest.write_text(manifest.read_text().replace("cpu_ms_per_task = 30000", 'cpu_ms_per_task = "lots"'))
    reloaded = daemon.cli("reload")
    assert reloaded.returncode == 1 and "withdrawn: first@local" in reloaded.stdout, reloaded.stdout
    named = daemon.cli("dispatch", "first go", "--agent", "first@local")
    assert named.returncode == 6 and "withdrawn" in named.stderr and "covenant agents check" in named.stderr
    assert daemon.cli("dispatch", "first go").returncode == 6


def test_reload_lists_an_edited_tool_file_or_entry_under_changed(daemon: DaemonProcess) -> None:
    """Issue 39 item 3: `changed` goes by the package's content, not the manifest alone."""
    manifest = daemon.add_agent("first", "echo.py", keywords=("first",))
    daemon.add_agent("second", "echo.py", keywords=("second",))
    daemon.start()
    untouched = daemon.cli("reload", "--json")
    assert json.loads(untouched.stdout)["changed"] == []
    code = manifest.parent / "echo.py"
    code.write_text(code.read_text() + "\n# a comment is an edit too\n")
    doc = json.loads(daemon.cli("reload", "--json").stdout)
    assert doc["changed"] == ["first@local"] and doc["rejected"] == [], doc


def test_bare_agent_name_logs_history_with_denials_and_numbered_audit_tail(daemon: DaemonProcess) -> None:
    daemon.add_agent("wordcount", "echo.py", keywords=("count",))
    daemon.add_agent("guarded", "echo.py", keywords=("guarded",), required=("tool.echo",))
    daemon.start()

    bare = daemon.cli("dispatch", "hello there", "--agent", "wordcount")
    assert bare.returncode == 0 and bare.stdout.strip() == "hello there", bare.stderr
    denied = daemon.cli("dispatch", "guarded work", "--json")
    assert denied.returncode == 3

    logs = daemon.cli("logs", "--json", check=True)
    entries = [json.loads(line) for line in logs.stdout.splitlines()]
    started = [e for e in entries if e["msg"] == "dispatch started"]
    finished = [e for e in entries if e["msg"] == "dispatch finished"]
    refused = [e for e in entries if e["msg"] == "dispatch refused"]
    assert [(e["agent"], e["issuer"]) for e in started] == [("wordcount@local", "tester@test")]
    assert finished[0]["outcome"] == "ok" and isinstance(finished[0]["ms"], int)
    assert finished[0]["intent"] == started[0]["intent"]
    assert refused[0]["agent"] == "guarded@local" and refused[0]["outcome"] == "capability_denied"
    text = daemon.cli("logs", check=True).stdout
    assert 'msg="dispatch finished"' in text and "agent=wordcount@local" in text and "issuer=tester@test" in text

    history = daemon.cli("history", check=True).stdout.splitlines()
    assert "denied" in history[0] and "guarded@local" in history[0] and "capability_denied" in history[0]
    assert "tester@test" in history[0]
    assert " ok " in history[1] and "wordcount@local" in history[1]
    as_json = json.loads(daemon.cli("history", "--json", check=True).stdout)
    assert [e["outcome"] for e in as_json] == ["denied", "ok"]
    only = json.loads(daemon.cli("history", "--json", "--agent", "wordcount@local", check=True).stdout)
    assert [e["outcome"] for e in only] == ["ok"]

    whole = daemon.cli("audit", "tail", "-n", "1000", check=True).stdout.splitlines()
    assert [int(line.split()[0]) for line in whole] == list(range(1, len(whole) + 1))
    seqs = [int(line.split()[2].removeprefix("seq=")) for line in whole]
    assert seqs != list(range(seqs[0], seqs[0] + len(seqs)))  # hidden checkpoints leave gaps in seq
    # Without -n, the last 10 records (issue 39 item 6), numbered 1..10 in this listing.
    last = daemon.cli("audit", "tail", check=True).stdout.splitlines()
    assert len(whole) > 10 and [line.split(None, 1)[1] for line in last] == [line.split(None, 1)[1] for line in whole[-10:]]


def test_every_command_that_takes_an_agent_takes_a_bare_name(daemon: DaemonProcess) -> None:
    """`echo` means `echo@local` to logs, history, audit tail, restart, agents show and sessions as it does to
    dispatch; a name that means no agent is an error naming it, the closest and the loaded ones (issue 39 item 4)."""
    daemon.add_agent("wordcount", "echo.py", keywords=("count",))
    daemon.add_agent("guarded", "echo.py", keywords=("guarded",), required=("tool.echo",))
    daemon.start()
    assert daemon.cli("dispatch", "count this", check=True).stdout.strip() == "count this"
    assert daemon.cli("dispatch", "guarded work").returncode == 3

    lines = [json.loads(line) for line in daemon.cli("logs", "--json", "--agent", "wordcount", check=True).stdout.splitlines()]
    assert {e["agent"] for e in lines} == {"wordcount@local"}
    assert [e["msg"] for e in lines if e["msg"].startswith("dispatch ")] == ["dispatch started", "dispatch finished"]
    history = json.loads(daemon.cli("history", "--json", "--agent", "wordcount", check=True).stdout)
    assert [(e["agent_id"], e["outcome"]) for e in history] == [("wordcount@local", "ok")]
    denied = json.loads(daemon.cli("history", "--json", "--agent", "guarded", check=True).stdout)
    assert [(e["agent_id"], e["outcome"]) for e in denied] == [("guarded@local", "denied")]
    records = daemon.cli("audit", "tail", "--agent", "wordcount", "-n", "100", check=True).stdout.splitlines()
    assert "agent.exited" in "".join(records) and all("agent=wordcount@local " in line for line in records)
    assert json.loads(daemon.cli("agents", "show", "wordcount", "--json", check=True).stdout)["id"] == "wordcount@local"
    restart = daemon.cli("restart", "wordcount", check=True)  # no replica: its file is read again (issue 39 item 5)
    assert restart.stdout.startswith("reloaded wordcount@local from ")

    named = "no agent with id 'wordcont' is loaded (did you mean wordcount@local? loaded: guarded@local, wordcount@local;"
    for command in (("logs", "--agent"), ("history", "--agent"), ("audit", "tail", "--agent"), ("sessions", "list", "--agent"),
                    ("restart",), ("agents", "show"), ("tools", "list")):
        refused = daemon.cli(*command, "wordcont")
        assert (refused.returncode, refused.stdout) == (6, ""), (command, refused.stdout, refused.stderr)
        assert named in refused.stderr, (command, refused.stderr)

    # A full id outlives its agent in the records; a bare name, or a full id nothing names, is still an error.
    shutil.rmtree(daemon.home / "agents" / "wordcount")
    assert "removed: wordcount@local" in daemon.cli("reload", check=True).stdout
    past = json.loads(daemon.cli("history", "--json", "--agent", "wordcount@local", check=True).stdout)
    assert [(e["agent_id"], e["outcome"]) for e in past] == [("wordcount@local", "ok")]
    assert daemon.cli("audit", "tail", "--agent", "wordcount@local", check=True).stdout
    for args in (("history", "--agent", "wordcount"), ("history", "--agent", "ghost@local"),
                 ("audit", "tail", "--agent", "ghost@local"), ("logs", "--agent", "wordcount")):
        refused = daemon.cli(*args)
        assert refused.returncode == 6 and f"no agent with id {args[-1]!r} is loaded" in refused.stderr, (args, refused.stderr)


def test_json_on_every_command(daemon: DaemonProcess) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from covenant.keys import public_key_hex

    init = json.loads(daemon.cli("init", "--json", check=True).stdout)
    assert init["home"] == str(daemon.home) and init["identity"] == {
        "display": "tester@test", "pubkey": init["identity"]["pubkey"], "created": False}
    assert len(init["daemon_pubkey"]) == 64 and init["created"] == []
    bob = public_key_hex(Ed25519PrivateKey.generate())
    added = json.loads(daemon.cli("identity", "add", "bob@lap", bob, "--json", check=True).stdout)
    assert added == {"display": "bob@lap", "pubkey": bob, "path": str(daemon.home / "identities.toml"), "added": True}
    granted = json.loads(daemon.cli("grant", "bob@lap", "tool.x", "tool.y", "--json", check=True).stdout)
    assert [(g["issuer"], g["action"]) for g in granted["grants"]] == [(bob, "tool.x"), (bob, "tool.y")]
    revoked = json.loads(daemon.cli("revoke", "bob@lap", "tool.x", "--json", check=True).stdout)
    assert revoked["actions"] == ["tool.x"] and revoked["issuer"] == bob and len(revoked["grants_affected"]) == 1
    daemon.start()
    assert json.loads(daemon.cli("reload", "--json", check=True).stdout)["rejected"] == []
    assert all(json.loads(line)["msg"] for line in daemon.cli("logs", "--json", check=True).stdout.splitlines())
    assert daemon.stop() == 0
    assert json.loads(daemon.cli("audit", "verify", "--json", check=True).stdout)["ok"] is True


def test_grants_table_is_aligned_and_all_shows_revocations(daemon: DaemonProcess) -> None:
    daemon.cli("grant", "tester@test", "tool.*", "memory.read", check=True)
    daemon.cli("revoke", "tester@test", "memory.read", "tool.web_fetch", check=True)
    short = daemon.cli("grants", check=True)
    lines = short.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "ISSUER", "ACTION", "GRANTED", "EXPIRES", "KEY", "NOTE"]
    assert len(lines) == 2 and "tool.*" in lines[1] and "revoked within: tool.web_fetch" in lines[1]
    assert lines[1].index("tool.*") == lines[0].index("ACTION")
    assert "2 revocation(s) not shown" in short.stderr and "--all" in short.stderr
    full = daemon.cli("grants", "--all", check=True).stdout.split("\n\n")
    revocations = full[1].splitlines()
    assert revocations[0].split() == ["REVOKED", "FROM", "ACTION", "REVOKED", "AT", "KEY"]
    assert sorted(line.split()[1] for line in revocations[1:]) == ["memory.read", "tool.web_fetch"]
    assert revocations[1].index(revocations[1].split()[1]) == revocations[0].index("ACTION")


def test_shell_completion_script_and_completions(daemon: DaemonProcess) -> None:
    script = daemon.cli("completion", "bash", check=True).stdout
    assert "_COVENANT_COMPLETE=bash_complete" in script and "complete " in script
    for shell in ("zsh", "fish"):
        assert "_COVENANT_COMPLETE" in daemon.cli("completion", shell, check=True).stdout
    words = daemon.cli(env={"_COVENANT_COMPLETE": "bash_complete", "COMP_WORDS": "covenant gra", "COMP_CWORD": "1"})
    assert words.stdout.split() == ["plain,grant", "plain,grants"]
    flags = daemon.cli(env={"_COVENANT_COMPLETE": "bash_complete", "COMP_WORDS": "covenant dispatch --ag",
                            "COMP_CWORD": "2"})
    assert flags.stdout.split() == ["plain,--agent"]


def test_full_queue_answers_503_with_retry_after(daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    from covenant.policy.identities import load_user_identity
    from covenant.policy.signing import new_intent, sign_intent
    from tests.daemon.test_daemon_e2e import status, wait_for

    daemon.start_with_one_slot()
    # Long enough that the slot and the queue stay full whatever the load; cancelled at the end.
    background = [daemon.cli_background("dispatch", "sleep 600", "--json") for _ in range(2)]
    wait_for(lambda: len(status(daemon)["in_flight"]) == 1 and status(daemon)["queued"] == 1, what="1 running + 1 queued")
    monkeypatch.setenv("XDG_CONFIG_HOME", daemon.env["XDG_CONFIG_HOME"])
    me = load_user_identity()
    intent = new_intent("sleep 0", issuer_display=me.display, issuer_pubkey=me.pubkey, agent=None,
                        priority="normal", parent=None)
    body = json.dumps({"intent": intent, "signature": sign_intent(me.key, intent)})
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(str(daemon.socket))
        connection = http.client.HTTPConnection("localhost")
        connection.sock = sock
        connection.request("POST", "/v1/dispatch", body, {"content-type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
    assert response.status == 503 and response.getheader("Retry-After") == "1"
    assert answer["error"]["code"] == "overloaded"
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGTERM)
    wait_for(lambda: daemon.process.poll() is not None or status(daemon)["shutting_down"], what="draining")
    assert daemon.stop(signal.SIGTERM, timeout=60) == 5  # the second SIGTERM cancels at once
    for proc in background:  # the running one is cancelled, the queued one refused: both exit 5
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 5, out + err + "\nDAEMONLOG\n" + daemon.log_path.read_text()


def test_hints_repeat_the_home_they_were_given(daemon: DaemonProcess, tmp_path: Path) -> None:
    """init's next step and the daemon-not-running hint name the home as it was given, so that a pasted
    hint acts on it (issue 39 item 12)."""
    env = {k: v for k, v in daemon.env.items() if k not in ("COVENANT_HOME", "COVENANT_SOCKET")}
    home = tmp_path / "a home"  # a space: the hint must quote it

    def covenant(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "covenant", *args], env={**env, **extra}, capture_output=True,
                              text=True, timeout=60)

    init = covenant("--home", str(home), "init")
    assert init.returncode == 0, init.stderr
    nxt = init.stdout.splitlines()[-1]
    assert shlex.split(nxt.split("`")[1]) == ["covenant", "--home", str(home), "daemon"], nxt
    status = covenant("--home", str(home), "status")
    assert status.returncode == 5
    assert shlex.split(status.stderr.split("start it with `")[1].split("`")[0]) == ["covenant", "--home", str(home), "daemon"]

    by_env = covenant("init", COVENANT_HOME=str(home)).stdout.splitlines()[-1]
    assert shlex.split(by_env.split("`")[1]) == [f"COVENANT_HOME={home}", "covenant", "daemon"], by_env
    status = covenant("status", COVENANT_HOME=str(home))
    assert f"start it with `COVENANT_HOME={shlex.quote(str(home))} covenant daemon`" in status.stderr


def test_a_second_daemon_on_a_served_home_exits_2_and_leaves_the_first_serving(daemon: DaemonProcess) -> None:
    """Whatever listeners it would bind, a second daemon names the first one's pid, exits 2 and leaves no
    socket behind (issue 39 item 13)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon.write_config(f'[webhooks]\nlisten = "127.0.0.1:{port}"\n')
    daemon.add_agent("echo", "echo.py")
    daemon.start()
    assert daemon.process is not None
    own_socket = daemon.home.parent / "second.sock"
    for extra in ((), ("--socket", str(own_socket))):
        second = daemon.cli("daemon", *extra, timeout=60)
        assert second.returncode == 2, second.stderr
        assert f"covenant: error: a daemon already serves this home, pid {daemon.process.pid} " in second.stderr
        assert "Traceback" not in second.stderr and "listen" not in second.stderr
    assert not own_socket.exists()
    assert json.loads(daemon.cli("status", "--json", check=True).stdout)["pid"] == daemon.process.pid
    assert daemon.cli("dispatch", "still here", "--agent", "echo", check=True).stdout == "still here\n"
    assert daemon.stop() == 0
    daemon.start()  # the lock went with the first daemon: a stale lock file never blocks a start
