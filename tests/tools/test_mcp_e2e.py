"""MCP end to end: a real daemon and replica, the scripted fake model, real MCP servers.

Servers: one of our own over streamable HTTP (tests/fakes/mcp_http_server.py, the SDK's MCPServer)
with a listed tool and an UNLISTED one that must never run; ``mcp-server-time`` and
``mcp-server-git`` from the package registry over stdio, run by the daemon as the agent's uid.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO_ROOT
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.processes import alive, processes_marked
from tests.rune.conftest import add_rune_agent, configure, outcome_of

from tests.conftest import rune_examples

BIN = Path(sys.executable).parent


class HttpServer:
    def __init__(self, base: Path, token: str | None = None, files: Path | None = None, port: int = 0) -> None:
        self.markers = base / "markers"
        self.markers.mkdir(parents=True)
        port_file = base / "port"
        argv = [sys.executable, "-m", "tests.fakes.mcp_http_server", "--port-file", str(port_file),
                "--marker-dir", str(self.markers)]
        if token:
            argv += ["--token", token]
        if files:
            argv += ["--files-dir", str(files)]
        if port:
            argv += ["--port", str(port)]
        self.process = subprocess.Popen(argv, cwd=REPO_ROOT)
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert self.process.poll() is None, "the MCP test server died"
            assert time.monotonic() < deadline, "the MCP test server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port_file.read_text()}/mcp"

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path / "mcp-http", token="tok-" + os.urandom(4).hex())
    yield server
    server.close()


def _tool_events(daemon: DaemonProcess, intent: str) -> list[dict]:
    records = [json.loads(line) for line in daemon.cli("audit", "tail", "--json", "-n", "1000000", check=True).stdout.splitlines()]
    return [r["data"] for r in records if r["type"] == "tool.call" and r["data"]["intent"] == intent]


def _tool_message(request, index: int = -1) -> dict:  # type: ignore[no-untyped-def]
    return json.loads([m for m in request.messages if m["role"] == "tool"][index]["content"])


def _mcp_status(daemon: DaemonProcess) -> list[dict]:
    return json.loads(daemon.cli("status", "--json", check=True).stdout)["mcp_servers"]


def _with_mcp_servers(folder: Path, servers: str) -> None:
    runefile = folder / "Runefile"
    runefile.write_text(runefile.read_text() + "mcp_servers:\n" + servers)


def _namespace_holder(daemon: DaemonProcess, member: int) -> int:
    """The pid of the daemon's child that holds the mount namespace ``member`` is in (``sleep infinity``).

    The holders of the uid's network namespaces (one per network mode) joined that mount namespace too;
    the mount namespace's own holder is the one still in the daemon's network namespace."""
    namespace = os.readlink(f"/proc/{member}/ns/mnt")
    daemon_net = os.readlink(f"/proc/{daemon.process.pid}/ns/net")
    holders = []
    for child in psutil.Process(daemon.process.pid).children():
        try:
            if ("sleep" in child.cmdline()[0] and os.readlink(f"/proc/{child.pid}/ns/mnt") == namespace
                    and os.readlink(f"/proc/{child.pid}/ns/net") == daemon_net):
                holders.append(child.pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, FileNotFoundError, IndexError):
            continue
    assert len(holders) == 1, holders
    return holders[0]


def test_only_listed_http_tools_are_offered_and_an_unlisted_one_never_runs(
    daemon: DaemonProcess, fake_model: FakeModelServer, http_server: HttpServer
) -> None:
    token = http_server.process.args[http_server.process.args.index("--token") + 1]
    configure(daemon, ("fake", fake_model), extra='[rune]\nmcp_header_env = ["MCP_TEST_TOKEN"]\n')
    daemon.env["MCP_TEST_TOKEN"] = token
    folder = add_rune_agent(daemon, "mcpuser", toolset=("local/echo",))
    _with_mcp_servers(folder, f"  - name: local\n    url: {http_server.url}\n    headers:\n      X-Token: \"${{MCP_TEST_TOKEN}}\"\n")
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.mcp.local.echo", "tool.mcp.local.wipe", check=True)
    fake_model.script(
        Reply.tools(ToolCall("local__wipe", {"target": "/"})),
        Reply.tools(ToolCall("wipe", {"target": "/"})),
        Reply.tools(ToolCall("local__echo", {"text": "hello"})),
        Reply(text="done"),
    )
    outcome = outcome_of(daemon.cli("dispatch", "go", "--agent", "mcpuser@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    first, second, third, fourth = fake_model.requests
    assert first.tool_names == ["local__echo"]  # discovery is not authority: wipe and read_file are not offered
    assert _tool_message(second)["error"]["code"] == "unknown_tool"
    assert _tool_message(third)["error"]["code"] == "unknown_tool"
    assert "hello" in json.dumps(_tool_message(fourth))
    assert not (http_server.markers / "wipe-ran").exists()
    assert (http_server.markers / "echo-ran").read_text() == "hello"
    events = _tool_events(daemon, outcome["intent_id"])
    assert [(e["name"], e["tool"], e["outcome"]) for e in events] == [
        ("local__wipe", None, "error"),
        ("wipe", None, "error"),
        ("local__echo", "tool.mcp.local.echo", "ok"),
    ]
    [server] = _mcp_status(daemon)
    assert server["state"] == "up" and server["server"] == "local" and "wipe" in server["tools"]
    assert token not in daemon.cli("status", check=True).stdout
    listed = json.loads(daemon.cli("tools", "list", "mcpuser", "--json", check=True).stdout)
    assert listed["daemon"] is True
    assert [(t["name"], t["action"], t["available"]) for t in listed["tools"]] == [
        ("local__echo", "tool.mcp.local.echo", True)]
    assert daemon.stop() == 0


def test_a_down_server_and_an_unset_header_variable_are_reported_and_the_agent_still_runs(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    configure(daemon, ("fake", fake_model), extra='[rune]\nmcp_header_env = ["MCP_UNSET_TOKEN"]\n')
    daemon.env.pop("MCP_UNSET_TOKEN", None)
    folder = add_rune_agent(daemon, "lonely", toolset=("down/echo", "secret/echo", "rune@system-time"))
    _with_mcp_servers(folder, "  - name: down\n    url: http://127.0.0.1:9/mcp\n"
                              "  - name: secret\n    url: http://127.0.0.1:9/mcp\n    headers:\n"
                              "      Authorization: \"Bearer ${MCP_UNSET_TOKEN}\"\n")
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(Reply.tools(ToolCall("down__echo", {"text": "x"})), Reply(text="still here"))
    outcome = outcome_of(daemon.cli("dispatch", "go", "--agent", "lonely@local", "--json"))
    assert outcome["outcome"] == "ok" and outcome["text"] == "still here", outcome
    assert fake_model.requests[0].tool_names == ["system-time"]
    assert _tool_message(fake_model.requests[1])["error"]["code"] == "unknown_tool"
    servers = {s["server"]: s for s in _mcp_status(daemon)}
    assert servers["down"]["state"] == "down" and "connect" in servers["down"]["last_error"].lower()
    assert servers["secret"]["state"] == "down" and "MCP_UNSET_TOKEN" in servers["secret"]["last_error"]
    deadline = time.monotonic() + 60
    while _mcp_status(daemon)[0]["attempts"] < 2:  # retried with backoff
        assert time.monotonic() < deadline
        time.sleep(0.2)
    text = daemon.cli("status", check=True).stdout
    assert "mcp        lonely@local down: down" in text and "retrying" in text
    listed = {t["entry"]: t for t in json.loads(daemon.cli("tools", "list", "lonely", "--json", check=True).stdout)["tools"]}
    assert listed["down/echo"]["available"] is False and "is down" in listed["down/echo"]["reason"]
    assert "MCP_UNSET_TOKEN" in listed["secret/echo"]["reason"] and listed["rune@system-time"]["available"] is True
    assert daemon.stop() == 0


def test_registry_stdio_servers_run_as_the_agent_uid_and_die_with_the_daemon(
    daemon: DaemonProcess, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    repo = Path(daemon.home.parent) / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("hi\n")
    for path in (repo, *repo.rglob("*")):
        os.chmod(path, 0o777 if path.is_dir() else 0o666)
    configure(daemon, ("fake", fake_model), extra=(
        f'[mcp.time]\ncommand = ["{BIN / "mcp-server-time"}"]\n'
        f'[mcp.git]\ncommand = ["{BIN / "mcp-server-git"}", "--repository", "{repo}"]\n'
        # The server runs as the agent's uid, not the repository's owner: git wants it marked safe.
        f'env = {{ GIT_CONFIG_COUNT = "1", GIT_CONFIG_KEY_0 = "safe.directory", GIT_CONFIG_VALUE_0 = "*" }}\n'
    ))
    add_rune_agent(daemon, "clock", toolset=("time/get_current_time", "git/git_status"))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(
        Reply.tools(ToolCall("time__get_current_time", {"timezone": "UTC"})),
        Reply.tools(ToolCall("git__git_status", {"repo_path": str(repo)})),
        Reply.tools(ToolCall("time__convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "UTC"})),
        Reply(text="ok"),
    )
    outcome = outcome_of(daemon.cli("dispatch", "what time?", "--agent", "clock@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    first, second, third, fourth = fake_model.requests
    assert first.tool_names == ["time__get_current_time", "git__git_status"]
    assert _tool_message(second)["timezone"] == "UTC"
    assert "notes.txt" in json.dumps(_tool_message(third))
    assert _tool_message(fourth)["error"]["code"] == "unknown_tool"  # advertised, not listed
    procs = processes_marked("mcp:clock@local", daemon.descendants())
    assert len(procs) >= 2
    assert all(p.uids().real != 0 and p.uids().real != os.geteuid() for p in procs)
    assert daemon.stop() == 0
    deadline = time.monotonic() + 30
    while any(p.is_running() and alive(p.pid) for p in procs):
        assert time.monotonic() < deadline, "an MCP server outlived the daemon"
        time.sleep(0.1)


def test_the_corpus_mcp_agent_runs_against_local_servers(
    daemon: DaemonProcess, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    files = tmp_path / "served"
    files.mkdir()
    (files / "README.md").write_text("covenant corpus test file\n")
    server = HttpServer(tmp_path / "fs", files=files)
    try:
        target = daemon.home / "agents" / "mcp-agent"
        shutil.copytree(rune_examples() / "mcp-agent", target)
        runefile = target / "Runefile"
        text = runefile.read_text().replace("http://localhost:3001/mcp", server.url)
        runefile.write_text(text.replace("http://localhost:3002/mcp", "http://127.0.0.1:9/mcp"))
        for folder, _dirs, names in os.walk(target):
            os.chmod(folder, 0o755)
            for name in names:
                os.chmod(os.path.join(folder, name), 0o644)
        configure(daemon, ("openai", fake_model), extra='[rune]\nmcp_header_env = ["GITHUB_TOKEN"]\n')
        daemon.env["GITHUB_TOKEN"] = "ghp-test"
        daemon.start()
        daemon.cli("grant", "tester@test", "tool.*", check=True)
        fake_model.script(Reply.tools(ToolCall("filesystem__read_file", {"path": "README.md"})), Reply(text="read it"))
        outcome = outcome_of(daemon.cli("dispatch", "read the readme", "--agent", "mcp-agent@local", "--json"))
        assert outcome["outcome"] == "ok" and outcome["text"] == "read it", outcome
        offered = fake_model.requests[0].tool_names
        assert "filesystem__read_file" in offered and not any(n.startswith("github__") for n in offered)
        assert "filesystem__write_file" not in offered  # listed, but this server does not advertise it
        assert "covenant corpus test file" in json.dumps(_tool_message(fake_model.requests[1]))
        assert daemon.stop() == 0
    finally:
        server.close()


def test_a_server_that_comes_up_later_is_connected_by_the_retries(
    daemon: DaemonProcess, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    configure(daemon, ("fake", fake_model))
    folder = add_rune_agent(daemon, "patient", toolset=("late/echo",))
    _with_mcp_servers(folder, f"  - name: late\n    url: http://127.0.0.1:{port}/mcp\n")
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(Reply(text="nothing yet"))
    outcome_of(daemon.cli("dispatch", "go", "--agent", "patient@local", "--json"))
    assert fake_model.requests[0].tool_names == []
    assert _mcp_status(daemon)[0]["state"] == "down"
    server = HttpServer(tmp_path / "late", port=port)
    try:
        deadline = time.monotonic() + 90
        while _mcp_status(daemon)[0]["state"] != "up":
            assert time.monotonic() < deadline, _mcp_status(daemon)
            time.sleep(0.3)
        daemon.cli("restart", "patient@local", check=True)  # the model is told its tools when the replica starts
        fake_model.script(Reply.tools(ToolCall("late__echo", {"text": "finally"})), Reply(text="ok"))
        outcome = outcome_of(daemon.cli("dispatch", "go", "--agent", "patient@local", "--json"))
        assert outcome["outcome"] == "ok", outcome
        assert fake_model.requests[-2].tool_names == ["late__echo"]
        assert (server.markers / "echo-ran").read_text() == "finally"
        assert daemon.stop() == 0
    finally:
        server.close()


def test_an_idle_stdio_server_outlives_the_thread_cache_of_trio(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """PR_SET_PDEATHSIG fires when the *thread* that spawned a process exits, and trio retires a
    worker thread left idle for 10 s: a server started from one was killed 10 s later, then again
    after each restart. Started from the runner's own launch threads, it stays up, and so does the
    holder of its uid's private /tmp (made with the server or the replica, also PDEATHSIG-armed)."""
    configure(daemon, ("fake", fake_model), extra=f'[mcp.time]\ncommand = ["{BIN / "mcp-server-time"}"]\n')
    add_rune_agent(daemon, "clock", toolset=("time/get_current_time",))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(Reply(text="awake"))  # the replica's start connects its MCP servers
    assert outcome_of(daemon.cli("dispatch", "wake up", "--agent", "clock@local", "--json"))["outcome"] == "ok"
    assert _mcp_status(daemon)[0]["state"] == "up", _mcp_status(daemon)
    before = {p.pid for p in processes_marked("mcp:clock@local", daemon.descendants())}
    assert before
    holder = _namespace_holder(daemon, min(before))
    time.sleep(13)  # past trio's IDLE_TIMEOUT of 10 s, with the daemon idle
    after = {p.pid for p in processes_marked("mcp:clock@local", daemon.descendants())}
    assert after == before, "the MCP server was killed and restarted while idle"
    assert alive(holder) and _namespace_holder(daemon, min(before)) == holder, "the private /tmp's holder died"
    assert _mcp_status(daemon)[0]["state"] == "up"
    fake_model.script(Reply.tools(ToolCall("time__get_current_time", {"timezone": "UTC"})), Reply(text="ok"))
    outcome = outcome_of(daemon.cli("dispatch", "what time?", "--agent", "clock@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    assert _tool_message(fake_model.requests[2])["timezone"] == "UTC"
    assert daemon.stop() == 0


def test_a_hostile_stdio_server_and_its_replica_share_the_uids_private_tmp(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """The server fills /tmp: it fills its uid's private tmpfs (disk_mb, 100 MiB), never the host's;
    it does not see the host's /tmp, except a folder its command line names. A grandchild it leaves
    in a session of its own does not outlive the daemon."""
    named = Path(tempfile.mkdtemp(prefix="covenant-mcp-named-", dir="/tmp"))  # a top-level entry of its own
    hidden = Path(tempfile.mkdtemp(prefix="covenant-mcp-hidden-", dir="/tmp"))
    filler = f"covenant-fill-{os.urandom(4).hex()}"
    try:
        os.chmod(named, 0o755)
        os.chmod(hidden, 0o755)
        (named / "seen.txt").write_text("named on the command line\n")
        (hidden / "unseen.txt").write_text("in the host's /tmp\n")
        for path in (named / "seen.txt", hidden / "unseen.txt"):
            os.chmod(path, 0o644)
        script = REPO_ROOT / "tests" / "fakes" / "mcp_stdio_server.py"
        configure(daemon, ("fake", fake_model),
                  extra=f'[mcp.hostile]\ncommand = ["{sys.executable}", "{script}", "--data={named}"]\n')
        add_rune_agent(daemon, "filler", toolset=("hostile/fill_tmp", "hostile/look", "hostile/escape"), max_steps=5)
        daemon.start()
        daemon.cli("grant", "tester@test", "tool.*", check=True)
        fake_model.script(
            Reply.tools(ToolCall("hostile__fill_tmp", {"name": filler})),
            Reply.tools(ToolCall("hostile__look", {"path": str(hidden / "unseen.txt")})),
            Reply.tools(ToolCall("hostile__look", {"path": str(named / "seen.txt")})),
            Reply.tools(ToolCall("hostile__escape", {})),
            Reply(text="done"),
        )
        outcome = outcome_of(daemon.cli("dispatch", "fill it", "--agent", "filler@local", "--json"))
        assert outcome["outcome"] == "ok", outcome
        filled = _tool_message(fake_model.requests[1])
        assert filled["error"] == "ENOSPC" and 90 * 2**20 <= filled["written"] <= 100 * 2**20, filled
        assert not (Path("/tmp") / filler).exists()
        assert _tool_message(fake_model.requests[2])["exists"] is False
        assert _tool_message(fake_model.requests[3])["exists"] is True
        escapee = _tool_message(fake_model.requests[4])["pid"]
        assert alive(escapee)
        [server] = [p for p in processes_marked("mcp:filler@local", daemon.descendants()) if p.pid != escapee]
        [replica] = processes_marked("replica:filler@local", daemon.descendants())
        private = os.readlink(f"/proc/{server.pid}/ns/mnt")
        assert filled["mount_ns"] == private == os.readlink(f"/proc/{replica.pid}/ns/mnt")
        assert private != os.readlink(f"/proc/{daemon.process.pid}/ns/mnt")
        assert daemon.stop() == 0
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in (server.pid, replica.pid, escapee)):
            assert time.monotonic() < deadline, "the server, its escaped grandchild or the replica outlived the daemon"
            time.sleep(0.1)
    finally:
        (Path("/tmp") / filler).unlink(missing_ok=True)
        shutil.rmtree(named)
        shutil.rmtree(hidden)
