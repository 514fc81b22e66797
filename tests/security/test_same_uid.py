"""A daemon that cannot switch uid still runs agents, and says so loudly; `require` refuses instead.

Run as root, the test starts the daemon as ``nobody`` (setpriv): the same
situation as a daemon on a laptop.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from covenant.client import DaemonClient, DaemonUnreachable
from tests.conftest import traversable_tmpdir
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.processes import alive, described, marked_processes_of, processes_marked, wait_gone

# Their daemons and commands all run as nobody, and some look for what nobody's processes left on the
# whole host: on one pytest-xdist worker, one test at a time.
pytestmark = pytest.mark.xdist_group("nobody")

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
@pytest.fixture
def nobody_home() -> Iterator[Path]:
    if os.geteuid() != 0 or SETPRIV is None:
        pytest.skip("starting a daemon as another (unprivileged) user needs root and setpriv")
    base = traversable_tmpdir()
    home = base / "home"
    home.mkdir()
    agent = home / "agents" / "echo"
    agent.mkdir(parents=True)
    shutil.copy(Path(__file__).parents[1] / "daemon" / "agents" / "echo.py", agent / "echo.py")
    (agent / "agent.toml").write_text(
        '[agent]\nid = "echo@local"\nname = "echo"\nversion = "0.1.0"\nruntime = "python3"\nentry = "echo.py"\n'
    )
    offline = home / "agents" / "offline"
    offline.mkdir()
    shutil.copy(Path(__file__).parent / "agents" / "offline.py", offline / "offline.py")
    (offline / "agent.toml").write_text(
        '[agent]\nid = "offline@local"\nname = "offline"\nversion = "0.1.0"\nruntime = "python3"\n'
        'entry = "offline.py"\n\n[resources]\nnetwork = "off"\n'
    )
    for path in [base, *base.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    yield home
    try:
        _nothing_of_nobodys_left()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _nothing_of_nobodys_left() -> None:
    """After every test as nobody, no process covenant started for nobody remains: one test's leak fails that
    test (naming the processes), not the next one that looks for nobody's processes."""
    deadline = time.monotonic() + 30
    while left := marked_processes_of(NOBODY):
        if time.monotonic() > deadline:
            named = described(left)
            for proc in left:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            raise AssertionError(f"processes covenant started for nobody outlived the test: {named}")
        time.sleep(0.1)


def as_nobody(home: Path, *args: str) -> list[str]:
    return [SETPRIV, "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",  # type: ignore[list-item]
            sys.executable, "-m", "covenant", "--home", str(home), *args]


def env_for(home: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home.parent), "XDG_CONFIG_HOME": str(home.parent / "xdg"),
            "LANG": "C.UTF-8"}


@contextmanager
def daemon_as_nobody(home: Path, env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The daemon run as ``nobody``, once its socket answers; (process, log file). Stopped at exit."""
    log_path = home.parent / "daemon.log"
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen(as_nobody(home, "daemon"), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert daemon.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            try:
                with DaemonClient(home / "run" / "covenant.sock", timeout=5) as client:
                    client.request("GET", "/v1/status")
                break
            except DaemonUnreachable:
                time.sleep(0.05)
        yield daemon, log_path
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)


def test_same_uid_is_said_at_start_in_status_and_in_every_record(nobody_home: Path) -> None:
    env = env_for(nobody_home)
    subprocess.run(as_nobody(nobody_home, "init", "--display", "nobody@test"), env=env, check=True, capture_output=True)
    (nobody_home / "covenant.toml").write_text('[runtime]\npython3 = "/usr/bin/python3"\n')
    with daemon_as_nobody(nobody_home, env) as (daemon, log_path):
        with DaemonClient(nobody_home / "run" / "covenant.sock", timeout=5) as client:
            doc = client.request("GET", "/v1/status")
        assert doc["isolation"] == "same-uid"
        assert "CAP_SETUID" in doc["isolation_detail"]["reason"]
        assert "isolation: same-uid" in log_path.read_text()
        status = subprocess.run(as_nobody(nobody_home, "status"), env=env, capture_output=True, text=True, check=True)
        assert "isolation  same-uid: agents run as the daemon's own uid (NOT isolated" in status.stdout
        # echo@local has the default network (outbound-https-only): as the daemon's own uid it could only
        # run in the host's network, which is refused unless [isolation] network = "host" says so.
        assert doc["isolation_detail"]["network"]["egress"] is False
        done = subprocess.run(as_nobody(nobody_home, "dispatch", "hello", "--agent", "echo@local", "--json"),
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 4, done.stderr
        refused = json.loads(done.stdout)
        assert refused["outcome"] == "spawn_failed" and '[isolation] network = "host"' in refused["error"]
        record = refused["record"]
        assert record["isolation"] == "same-uid" and record["uid"] is None
        _network_off_runs_in_a_namespace_of_its_own(nobody_home, env, daemon.pid)


def _network_off_runs_in_a_namespace_of_its_own(home: Path, env: dict[str, str], daemon_pid: int) -> None:
    """Without CAP_SYS_ADMIN the namespace comes with a user namespace (``unshare -U -n``), from inside
    which covenant's exec helper (a memfd behind /proc/<daemon>/fd) cannot be executed: the helper runs
    first."""
    done = subprocess.run(as_nobody(home, "dispatch", "hello", "--agent", "offline@local", "--json"),
                          env=env, capture_output=True, text=True, timeout=120)
    _answered_from_an_empty_namespace(done, lambda outcome: outcome["text"], daemon_pid)


def test_covenant_run_as_an_ordinary_user_runs_a_network_off_agent(nobody_home: Path) -> None:
    """`covenant run` (no daemon) goes through the same launcher: the helper before `unshare -U -n`."""
    env = env_for(nobody_home)
    subprocess.run(as_nobody(nobody_home, "init", "--display", "nobody@test"), env=env, check=True, capture_output=True)
    (nobody_home / "covenant.toml").write_text('[runtime]\npython3 = "/usr/bin/python3"\n')
    done = subprocess.run(as_nobody(nobody_home, "run", str(nobody_home / "agents" / "offline"), "hello", "--json"),
                          env=env, capture_output=True, text=True, timeout=120)
    # run --json prints the dispatch record
    _answered_from_an_empty_namespace(done, lambda record: record["result"]["text"], os.getpid())


def _answered_from_an_empty_namespace(
    done: subprocess.CompletedProcess[str], text_of: Callable[[dict], str], outside_pid: int
) -> None:
    """The offline agent answered from a network namespace of its own with only lo in it; where this
    kernel refuses unprivileged user namespaces, it was refused instead (network = "off" fails closed)."""
    probe = [SETPRIV, "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", "unshare", "-U", "-n", "true"]
    if subprocess.run(probe, capture_output=True).returncode != 0:  # type: ignore[arg-type]
        assert done.returncode != 0 and "network namespace" in done.stdout + done.stderr, done
        return
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(text_of(json.loads(done.stdout)))
    assert seen["netns"] != os.readlink(f"/proc/{outside_pid}/ns/net") and seen["interfaces"] == ["lo"], seen


def test_require_refuses_to_start_without_isolation(nobody_home: Path) -> None:
    env = env_for(nobody_home)
    subprocess.run(as_nobody(nobody_home, "init", "--display", "nobody@test"), env=env, check=True, capture_output=True)
    (nobody_home / "covenant.toml").write_text("[isolation]\nrequire = true\n")
    done = subprocess.run(as_nobody(nobody_home, "daemon"), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "isolation.require = true" in done.stderr and "CAP_SETUID" in done.stderr
    assert not (nobody_home / "run" / "covenant.sock").exists()


CLOCK_RUNEFILE = """\
name: clock
version: 0.1.0
instructions: You tell the time.
default_model: default
toolset: ["time/get_current_time"]
max_steps: 4
timeout_ms: 60000
runtime:
  startup_timeout_ms: 30000
models:
  providers: ["fake"]
  model_mapping:
    default: fake-model
"""


def _nobodys_package(folder: Path, runefile: str) -> Path:
    """A Rune package at ``folder`` with this Runefile, owned by nobody (the daemon or `covenant run`)."""
    folder.mkdir()
    (folder / "Runefile").write_text(runefile)
    os.chown(folder, NOBODY, NOBODY)
    os.chown(folder / "Runefile", NOBODY, NOBODY)
    return folder


def _rune_config(home: Path, fake_model: FakeModelServer) -> None:
    """covenant.toml for a Rune agent whose one tool comes from ``mcp-server-time`` over stdio."""
    mcp_server_time = Path(sys.executable).parent / "mcp-server-time"
    (home / "covenant.toml").write_text(
        f'[runtime]\npython3 = "/usr/bin/python3"\n\n[mcp.time]\ncommand = ["{mcp_server_time}"]\n\n'
        + fake_model.provider_toml("fake", timeout_s=30)
    )
    os.chown(home / "covenant.toml", NOBODY, NOBODY)


def _script_one_tool_call(fake_model: FakeModelServer, text: str) -> None:
    fake_model.script(Reply.tools(ToolCall("time__get_current_time", {"timezone": "UTC"})), Reply(text=text))


def _the_tool_answered(fake_model: FakeModelServer) -> None:
    first, second = fake_model.requests
    assert first.tool_names == ["time__get_current_time"]
    answer = json.loads([m for m in second.messages if m["role"] == "tool"][-1]["content"])
    assert answer["timezone"] == "UTC" and "datetime" in answer, answer


def test_a_rune_agent_and_its_stdio_mcp_server_run_under_an_ordinary_users_daemon(
    nobody_home: Path, fake_model: FakeModelServer
) -> None:
    """The replica and the MCP server go through the launcher an unprivileged daemon has: no uid switch,
    `unshare -U -n` for the replica; the server runs as the daemon's uid and ends with it."""
    env = env_for(nobody_home)
    subprocess.run(as_nobody(nobody_home, "init", "--display", "nobody@test"), env=env, check=True, capture_output=True)
    _nobodys_package(nobody_home / "agents" / "clock", CLOCK_RUNEFILE)
    _rune_config(nobody_home, fake_model)
    with daemon_as_nobody(nobody_home, env) as (daemon, log_path):
        subprocess.run(as_nobody(nobody_home, "grant", "nobody@test", "tool.mcp.time.get_current_time"),
                       env=env, check=True, capture_output=True)
        _script_one_tool_call(fake_model, "it is noon somewhere")
        done = subprocess.run(as_nobody(nobody_home, "dispatch", "what time is it", "--agent", "clock@local", "--json"),
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr + log_path.read_text()
        assert json.loads(done.stdout)["text"] == "it is noon somewhere"
        _the_tool_answered(fake_model)
        servers = processes_marked("mcp:clock@local", psutil.Process(daemon.pid).children(recursive=True))
        assert servers and all(p.uids().real == NOBODY for p in servers), servers
    deadline = time.monotonic() + 30
    while any(alive(p.pid) for p in servers):
        assert time.monotonic() < deadline, "the MCP server outlived the daemon"
        time.sleep(0.1)


def test_covenant_run_as_an_ordinary_user_runs_a_rune_package_with_a_stdio_mcp_server(
    nobody_home: Path, fake_model: FakeModelServer
) -> None:
    """`covenant run` hosts the package itself (replica, model loop, MCP server), no daemon involved."""
    env = env_for(nobody_home)
    subprocess.run(as_nobody(nobody_home, "init", "--display", "nobody@test"), env=env, check=True, capture_output=True)
    package = _nobodys_package(nobody_home.parent / "clock", CLOCK_RUNEFILE)
    _rune_config(nobody_home, fake_model)
    _script_one_tool_call(fake_model, "it is noon somewhere")
    before = {p.pid for p in marked_processes_of(NOBODY)}
    done = subprocess.run(as_nobody(nobody_home, "run", str(package), "what time is it", "--json"),
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["result"]["text"] == "it is noon somewhere"
    _the_tool_answered(fake_model)
    # Nothing the command started for nobody outlived it: covenant run stops its servers before it exits.
    outlived = [p for p in marked_processes_of(NOBODY) if p.pid not in before]
    assert outlived == [], (described(outlived), done.stderr)


ESCAPE_RUNEFILE = CLOCK_RUNEFILE.replace('toolset: ["time/get_current_time"]', 'toolset: ["hostile/escape"]')


def _hostile_package(home: Path, fake_model: FakeModelServer) -> Path:
    """The agent clock@local whose one tool is our hostile stdio server's ``escape``: it leaves a grandchild
    asleep in a session of its own. Returns the package folder."""
    package = _nobodys_package(home / "agents" / "clock", ESCAPE_RUNEFILE)
    script = home.parent / "hostile_server.py"
    shutil.copy(Path(__file__).parents[1] / "fakes" / "mcp_stdio_server.py", script)
    os.chown(script, NOBODY, NOBODY)
    (home / "covenant.toml").write_text(
        f'[runtime]\npython3 = "/usr/bin/python3"\n\n[mcp.hostile]\ncommand = ["{sys.executable}", "{script}"]\n\n'
        + fake_model.provider_toml("fake", timeout_s=30)
    )
    os.chown(home / "covenant.toml", NOBODY, NOBODY)
    fake_model.script(
        Reply.tools(ToolCall("hostile__escape", {}), ToolCall("hostile__escape", {"clear_environment": True})),
        Reply(text="left two behind"),
    )
    return package


def _escapees(fake_model: FakeModelServer) -> tuple[int, int]:
    """(the one still marked, the one with an empty environment)."""
    marked, bare = (json.loads(m["content"])["pid"] for m in fake_model.requests[1].messages if m["role"] == "tool")
    return marked, bare


def _gone(pid: int) -> None:
    if not wait_gone(pid, 30):
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"{pid}, left behind by an MCP server, was not ended")


def test_what_a_stdio_mcp_server_leaves_behind_ends_with_it_or_with_an_ordinary_users_daemon(
    nobody_home: Path, fake_model: FakeModelServer
) -> None:
    """Same uid as the daemon, so no uid sweep. The daemon, as child subreaper, adopted both orphans: the
    one still marked with the server's COVENANT_INTENT_ID ends when the server stops (here with its
    replica's restart), the one that emptied its environment when the daemon stops."""
    env = env_for(nobody_home)
    subprocess.run(as_nobody(nobody_home, "init", "--display", "nobody@test"), env=env, check=True, capture_output=True)
    _hostile_package(nobody_home, fake_model)
    with daemon_as_nobody(nobody_home, env) as (daemon, log_path):
        subprocess.run(as_nobody(nobody_home, "grant", "nobody@test", "tool.*"), env=env, check=True,
                       capture_output=True)
        done = subprocess.run(as_nobody(nobody_home, "dispatch", "escape", "--agent", "clock@local", "--json"),
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr + log_path.read_text()
        marked, bare = _escapees(fake_model)
        assert all(alive(pid) and psutil.Process(pid).ppid() == daemon.pid for pid in (marked, bare))  # adopted
        subprocess.run(as_nobody(nobody_home, "restart", "clock"), env=env, check=True, capture_output=True)
        _gone(marked)
        assert alive(bare)
    _gone(bare)
    assert "killed processes agents left behind" in log_path.read_text()


def test_what_a_stdio_mcp_server_leaves_behind_does_not_outlive_covenant_run_as_an_ordinary_user(
    nobody_home: Path, fake_model: FakeModelServer
) -> None:
    env = env_for(nobody_home)
    subprocess.run(as_nobody(nobody_home, "init", "--display", "nobody@test"), env=env, check=True, capture_output=True)
    package = _hostile_package(nobody_home, fake_model)
    done = subprocess.run(as_nobody(nobody_home, "run", str(package), "escape"),
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "left two behind\n", done.stdout + done.stderr
    for pid in _escapees(fake_model):
        _gone(pid)
