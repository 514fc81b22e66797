"""Privilege separation pieces: the uid table, the credentialed exec helper, the uid sweep,
private /tmp, the home's modes and what agent uids can reach. Real processes, run as root."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import trio

from covenant.config import IsolationConfig, McpServerConfig, RuntimeConfig
from covenant.errors import ConfigError
from covenant.home import Home, home_dir, socket_file
from covenant.homeinit import check_home_modes, init_home
from covenant.policy._files import atomic_write_text
from covenant.runtime import _elf, _procfs, host, uidkill
from covenant.runtime.isolation import Isolation, open_isolation, reachability_problems
from covenant.runtime.launcher import AgentCredentials, LaunchError, LaunchPlan, ProcessGroupLauncher
from covenant.runtime.liveroots import LiveRoots
from covenant.runtime.pdeathsig import GATE_BYTE
from covenant.runtime.runner import Runner
from tests.conftest import agent_uid_range
from tests.runtime.conftest import make_agent, make_payload

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
UID = 61999


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


# -- the uid table ------------------------------------------------------------------------------


@root_only
def test_uids_are_deterministic_persistent_and_unique(agent_reachable_dir: Path) -> None:
    a = agent_reachable_dir / "a"
    first = open_isolation(IsolationConfig(), a).credentials_for("echo@local")
    assert first is not None and first.uid == first.gid and 61184 <= first.uid <= 65519
    reopened = open_isolation(IsolationConfig(), a)
    assert reopened.known_credentials("echo@local") == first  # kept in the table, no I/O needed
    assert reopened.credentials_for("echo@local") == first
    table = a / "isolation" / "uids.json"
    doc = json.loads(table.read_text())
    assert mode(table) == 0o600 and doc["agents"] == {"echo@local": first.uid} and len(doc["salt"]) == 32
    # Another home salts differently: the same agent id gets an unrelated uid (same one 1 time in 4336).
    others = {open_isolation(IsolationConfig(), agent_reachable_dir / f"h{i}").credentials_for("echo@local")
              for i in range(4)}
    assert len(others | {first}) >= 3
    # The start-up sweep covers this home's uids only, not the whole range.
    assert reopened.owns_uid(first.uid) and not reopened.owns_uid(first.uid + 7)
    # A range of two: the second agent probes past the first one's uid, the third finds none.
    low, high = agent_uid_range(2)
    iso = open_isolation(IsolationConfig(uid_range=(low, high)), agent_reachable_dir / "c")
    uids = {iso.credentials_for(name).uid for name in ("one@local", "two@local")}  # type: ignore[union-attr]
    assert uids == {low, high}
    with pytest.raises(LaunchError, match=r"no free uid left in isolation.uid_range"):
        iso.credentials_for("three@local")


@root_only
def test_two_homes_with_one_range_never_share_a_uid(agent_reachable_dir: Path) -> None:
    """Each uid is held host-wide by one home (/run/covenant-uids/<uid>.lock): a second home with the
    same range probes past it, and a uid that runs a process or owns a workspace entry is skipped."""
    low, high = agent_uid_range(4)
    config = IsolationConfig(uid_range=(low, high))
    first = open_isolation(config, agent_reachable_dir / "a")
    taken = {first.credentials_for(name).uid for name in ("one@local", "two@local")}  # type: ignore[union-attr]
    second = open_isolation(config, agent_reachable_dir / "b")
    busy = next(uid for uid in range(low, high + 1) if uid not in taken)
    sleeper = subprocess.Popen(["/bin/sleep", "60"], user=busy, group=busy)
    try:
        (agent_reachable_dir / "b" / "workspaces").mkdir(parents=True)
        (agent_reachable_dir / "b" / "workspaces" / "old").mkdir()
        last = next(uid for uid in range(low, high + 1) if uid not in taken and uid != busy)
        os.chown(agent_reachable_dir / "b" / "workspaces" / "old", last, last)
        with pytest.raises(LaunchError, match=r"no free uid left"):
            second.credentials_for("one@local")  # the same agent id in another home
    finally:
        sleeper.kill()
        sleeper.wait()
    assert second.credentials_for("one@local").uid == busy  # type: ignore[union-attr]
    held = (Path("/run/covenant-uids") / f"{busy}.lock")
    assert held.read_text().split("\n")[0] == str((agent_reachable_dir / "b").resolve())
    assert stat.S_IMODE(held.stat().st_mode) == 0o600 and held.stat().st_uid == 0
    # A restart of the first home keeps its uids; the same home opened twice in one process shares them.
    again = open_isolation(config, agent_reachable_dir / "a")
    assert {again.credentials_for(name).uid for name in ("one@local", "two@local")} == taken  # type: ignore[union-attr]


@root_only
def test_a_damaged_uid_table_is_an_error_naming_the_file(agent_reachable_dir: Path) -> None:
    table = agent_reachable_dir / "isolation" / "uids.json"
    table.parent.mkdir()
    table.write_text('{"agents": {"x": "not a uid"}}')
    with pytest.raises(ConfigError, match=str(table)):
        open_isolation(IsolationConfig(), agent_reachable_dir)


def test_the_range_must_be_unprivileged() -> None:
    with pytest.raises(ValueError, match="uid_range"):
        IsolationConfig(uid_range=(0, 10))


def test_fixed_user_must_exist_and_not_be_root(agent_reachable_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the account checks run only where uids can be switched")
    with pytest.raises(ConfigError, match="no such account"):
        open_isolation(IsolationConfig(user="no-such-covenant-user"), agent_reachable_dir)
    with pytest.raises(ConfigError, match="never run as root"):
        open_isolation(IsolationConfig(user="root"), agent_reachable_dir)
    nobody = open_isolation(IsolationConfig(user="nobody"), agent_reachable_dir)
    assert nobody.credentials_for("a@x") == nobody.credentials_for("b@y") != None  # noqa: E711


# -- the credentialed exec helper -----------------------------------------------------------------


@root_only
def test_the_helper_becomes_the_uid_with_no_groups_and_no_new_privileges() -> None:
    wrapper = host.pdeathsig_wrapper(credentials=True)
    if wrapper is None:
        pytest.skip("covenant's own helper exists for x86-64 only")
    script = "id -u; id -g; id -G; grep NoNewPrivs /proc/self/status"
    done = subprocess.run([*wrapper.argv, "/bin/sh", "-c", script], input=_elf.credentials_block(UID, UID + 1) + GATE_BYTE,
                          capture_output=True, env={}, start_new_session=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split("\n")[:4] == [str(UID), str(UID + 1), str(UID + 1), "NoNewPrivs:\t1"]


@root_only
@pytest.mark.parametrize("uid,gid", [(0, UID), (UID, 0)])
def test_the_helper_never_runs_anything_as_root(uid: int, gid: int, tmp_path: Path) -> None:
    wrapper = host.pdeathsig_wrapper(credentials=True)
    if wrapper is None:
        pytest.skip("covenant's own helper exists for x86-64 only")
    marker = tmp_path / "ran"
    done = subprocess.run([*wrapper.argv, "/bin/touch", str(marker)], input=_elf.credentials_block(uid, gid) + GATE_BYTE)
    assert done.returncode == -9 and not marker.exists()
    with pytest.raises(LaunchError, match="never root"):
        ProcessGroupLauncher().launch(LaunchPlan(argv=("/bin/true",), env={}, cwd="/", credentials=AgentCredentials(uid, gid)))


@root_only
def test_a_short_credentials_block_aborts(tmp_path: Path) -> None:
    wrapper = host.pdeathsig_wrapper(credentials=True)
    if wrapper is None:
        pytest.skip("covenant's own helper exists for x86-64 only")
    marker = tmp_path / "ran"
    done = subprocess.run([*wrapper.argv, "/bin/touch", str(marker)], input=_elf.credentials_block(UID, UID)[:7])
    assert done.returncode == -9 and not marker.exists()


# -- the uid sweep ----------------------------------------------------------------------------------


def _uid_processes(uid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if not fields.get("State", "").strip().startswith("Z") and int(fields["Uid"].split()[0]) == uid:
            found.append(int(name))
    return found


@root_only
def test_kill_uid_kills_hidden_processes_of_that_uid_only() -> None:
    hide = "import ctypes, os, time\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\nos.setsid()\ntime.sleep(60)"
    victims = [subprocess.Popen(["/usr/bin/python3", "-c", hide], user=UID, group=UID, extra_groups=[], env={})
               for _ in range(3)]
    bystander = subprocess.Popen(["sleep", "60"], user=UID + 1, group=UID + 1, extra_groups=[])
    try:
        deadline = time.monotonic() + 30
        while len(_uid_processes(UID)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert uidkill.kill_uid(UID, UID)
        for victim in victims:
            assert victim.wait(timeout=10) == -9
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    with pytest.raises(ValueError):
        uidkill.kill_uid(0, 0)


def test_live_roots_say_when_the_last_run_of_a_uid_ended() -> None:
    roots = LiveRoots()
    roots.add(UID)
    roots.add(UID)
    roots.remove(UID)
    assert roots.live(UID) and roots.passing(UID)
    roots.remove(UID)
    assert not roots.live(UID) and not roots.passing(UID) and roots.uids() == set()


def test_live_roots_tell_resident_roots_from_passing_ones() -> None:
    roots = LiveRoots()
    roots.add(UID, resident=True)  # a replica
    roots.add(UID)  # one of its tool runs
    assert roots.passing(UID)
    roots.remove(UID)
    assert roots.live(UID) and not roots.passing(UID)  # its escapes may be ended now
    roots.remove(UID, resident=True)
    assert not roots.live(UID) and roots.uids() == set()


@root_only
def test_concurrent_runs_of_one_agent_share_its_uid_and_the_sweep_waits_for_the_last(agent_reachable_dir: Path) -> None:
    """A run ending while another of the same uid lives must not kill the other one."""
    # A range of its own: on a shared CI box, other homes' runs live in the default one.
    iso = open_isolation(IsolationConfig(uid_range=(300000, 300999)), agent_reachable_dir / "state")
    slow = make_agent(Path(__file__).parents[1] / "daemon" / "agents" / "slow.py", cpu_ms_per_task=30_000)
    quick = make_agent("fault.py", cpu_ms_per_task=30_000)
    assert slow.id == quick.id  # one agent id: one uid

    async def main() -> list[str]:
        async with Runner.open(RuntimeConfig(python3="/usr/bin/python3"), scratch_root=agent_reachable_dir / "scratch",
                               isolation=iso) as runner:
            outcomes: list[str] = []

            async def one(agent, text: str) -> None:  # type: ignore[no-untyped-def]
                record = await runner.run(agent, make_payload(text))
                outcomes.append(f"{record.outcome} {record.result and record.result['text']}")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, slow, "sleep 3")
                await trio.sleep(0.5)
                for _ in range(3):
                    await one(quick, "echo quick")
            return outcomes

    assert trio.run(main) == ["ok quick"] * 3 + ["ok slept 3.0"]


@root_only
def test_without_the_exec_helper_network_off_agents_are_switched_by_unshare(agent_reachable_dir: Path) -> None:
    """``runtime.pdeathsig = false`` (also: hosts without covenant's helper): CPython would switch the
    child to the agent's uid before it execs ``unshare -n``, which needs root, and every
    ``network = "off"`` agent crashed. unshare makes the namespace, then switches."""
    entry = agent_reachable_dir / "offline.py"
    entry.write_text(
        "import json, os, sys\n"
        "intent = json.loads(sys.stdin.readline())\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())\n"
        "lines = open('/proc/self/net/dev').read().splitlines()[2:]\n"
        "seen = {'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(), 'caps': status['CapEff'].strip(),\n"
        "        'interfaces': [line.split(':')[0].strip() for line in lines]}\n"
        "print(json.dumps({'intent_id': intent['id'], 'status': 'ok', 'text': json.dumps(seen), 'sources': []}))\n"
    )
    iso = open_isolation(IsolationConfig(uid_range=(302000, 302999)), agent_reachable_dir / "state")

    async def main():  # type: ignore[no-untyped-def]
        async with Runner.open(RuntimeConfig(python3="/usr/bin/python3", pdeathsig=False),
                               scratch_root=agent_reachable_dir / "scratch", isolation=iso) as runner:
            return await runner.run(make_agent(entry, network="off"), make_payload("look"))

    record = trio.run(main)
    assert record.outcome == "ok", (record.error, record.stderr_tail)
    seen = json.loads(record.result["text"])
    assert 302000 <= seen["uid"] <= 302999 and seen["gid"] == seen["uid"] and seen["groups"] in ([], [seen["gid"]])
    assert seen["caps"] == "0" * 16 and seen["interfaces"] == ["lo"], seen
    assert record.network_enforced


# -- private /tmp ------------------------------------------------------------------------------------


@root_only
def test_private_tmp_hides_the_hosts_but_keeps_the_package_home_and_visible_paths(agent_reachable_dir: Path) -> None:
    secret = Path("/tmp") / f"covenant-host-only-{os.getpid()}"
    secret.write_text("host")
    visible = Path(tempfile.mkdtemp(prefix="covenant-visible-", dir="/tmp"))  # e.g. an MCP server's argument
    package = agent_reachable_dir / "pkg"
    package.mkdir()
    entry = package / "look.py"
    entry.write_text(
        "import json, os, sys\n"
        "intent = json.loads(sys.stdin.readline())\n"
        "open('/tmp/left-behind', 'w').write('x' * 5000)\n"
        "seen = {'tmp': sorted(os.listdir('/tmp')), 'cwd': os.getcwd(), 'shm': os.listdir('/dev/shm')}\n"
        "print(json.dumps({'intent_id': intent['id'], 'status': 'ok', 'text': json.dumps(seen), 'sources': []}))\n"
    )
    iso = open_isolation(IsolationConfig(), agent_reachable_dir / "state")

    async def main():  # type: ignore[no-untyped-def]
        async with Runner.open(RuntimeConfig(python3="/usr/bin/python3"), scratch_root=agent_reachable_dir / "scratch",
                               isolation=iso, visible=[str(visible / "repo")]) as runner:
            assert runner.mount_namespaces is not None, iso.problems
            first = await runner.run(make_agent(entry), make_payload("look"))
            second = await runner.run(make_agent(entry), make_payload("look"))
            return first, second

    try:
        first, second = trio.run(main)
    finally:
        secret.unlink()
        visible.rmdir()
    seen = json.loads(first.result["text"])
    assert seen["cwd"] == str(package)
    kept = sorted([agent_reachable_dir.name, visible.name, "left-behind"])
    assert seen["tmp"] == kept and seen["shm"] == []
    assert first.scratch_peak_bytes >= 5000  # what it left in its /tmp counts as its disk use
    assert json.loads(second.result["text"])["tmp"] == kept
    assert package.exists() and entry.exists()  # emptying the private /tmp never touched what was bound back
    assert not Path("/tmp/left-behind").exists()


def test_an_mcp_servers_named_paths_are_its_absolute_arguments_and_cwd() -> None:
    server = McpServerConfig(command=("srv", "--repository", "/tmp/repo", "--data=/tmp/data", "rel", "-v"), cwd="/srv")
    assert server.named_paths() == ["/tmp/repo", "/tmp/data", "/srv"]
    assert McpServerConfig(command=("/opt/srv",)).named_paths() == []  # the program is resolved by the daemon


@root_only
def test_namespace_holders_are_never_strangers_and_a_dead_one_is_reaped_when_replaced(agent_reachable_dir: Path) -> None:
    """Each agent uid's holder is covenant's child, yet no scan for orphans reads it (a dispatch's end
    would cost a read per agent uid); a holder that died is replaced, and reaped only once off the list."""
    iso = open_isolation(IsolationConfig(uid_range=(301000, 301999)), agent_reachable_dir / "state")
    first = make_agent("fault.py")
    second = first.model_copy(update={"id": "other@test"})

    async def main() -> tuple[list[str], int, set[int]]:
        # Children this test process had already (another test's, under pytest-xdist) are not the runner's.
        earlier = set(_procfs.thread_children(os.getpid()))
        async with Runner.open(RuntimeConfig(python3="/usr/bin/python3"), scratch_root=agent_reachable_dir / "scratch",
                               isolation=iso) as runner:
            spaces = runner.mount_namespaces
            assert spaces is not None, iso.problems
            outcomes = [(await runner.run(agent, make_payload("echo hi"))).outcome for agent in (first, second)]
            holders = set(spaces.holder_pids)
            assert len(holders) == 2 and all(_procfs.read_stat(pid).ppid == os.getpid() for pid in holders)
            assert [pid for pid in runner.uids.strangers() if pid not in earlier] == []
            victim = min(holders)
            os.kill(victim, signal.SIGKILL)
            while _procfs.read_stat(victim).state != "Z":
                await trio.sleep(0.01)
            assert victim in spaces.holder_pids  # dead, but not reaped: its pid cannot be reused yet
            outcomes += [(await runner.run(agent, make_payload("echo hi"))).outcome for agent in (first, second)]
            return outcomes, victim, set(spaces.holder_pids)

    outcomes, victim, holders = trio.run(main)
    assert outcomes == ["ok"] * 4
    assert victim not in holders and len(holders) == 2
    with pytest.raises(ChildProcessError):
        os.waitpid(victim, os.WNOHANG)  # reaped by the replacement, not left a zombie


# -- the home's modes and what agents can reach ----------------------------------------------------


def test_init_sets_the_modes_and_writers_keep_them(home: Home) -> None:
    init_home(home)
    expected = {home.root: 0o711, home.agents_dir: 0o755, home.identity_dir: 0o700, home.daemon_key_path: 0o600,
                home.audit_dir: 0o700, home.state_dir: 0o711, home.workspaces_dir: 0o711,
                home.dispatches_dir: 0o700, home.run_dir: 0o750, home.config_path: 0o600, home.grants_path: 0o600}
    assert {p: mode(p) for p in expected} == expected
    home.grants_path.chmod(0o644)  # as an older covenant left it
    atomic_write_text(home.grants_path, "# rewritten\n")
    assert mode(home.grants_path) == 0o600
    home.grants_path.chmod(0o644)
    init_home(home)  # every daemon start narrows again
    assert mode(home.grants_path) == 0o600
    assert check_home_modes(home) == []


@root_only
def test_a_readable_key_someone_else_owns_is_a_refusal_with_the_chmod(home: Home) -> None:
    init_home(home)
    os.chown(home.daemon_key_path, UID, UID)
    home.daemon_key_path.chmod(0o644)
    with pytest.raises(ConfigError, match=rf"fix: chmod 600 {home.daemon_key_path}"):
        check_home_modes(home)
    os.chown(home.config_path, UID, UID)
    home.config_path.chmod(0o644)
    home.daemon_key_path.chmod(0o600)
    assert [w for w in check_home_modes(home) if "chmod 600" in w and "covenant.toml" in w]


@root_only
def test_reachability_names_the_blocking_dir_and_the_setting(agent_reachable_dir: Path) -> None:
    iso = open_isolation(IsolationConfig(), agent_reachable_dir / "state")
    closed = agent_reachable_dir / "closed"
    (closed / "bin").mkdir(parents=True)
    closed.chmod(0o700)
    tool = closed / "bin" / "python3"
    tool.write_text("")
    tool.chmod(0o755)
    problems = reachability_problems([(str(tool), "file", "runtime.python3"), ("/usr/bin/python3", "file", "x")], iso)
    assert problems == [f"{tool} is not reachable by agent uids: {closed} is not searchable by others (mode 0700); "
                        "install it elsewhere or set runtime.python3"]
    assert reachability_problems([(str(tool), "file", "x")], Isolation.same_uid()) == []


@root_only
def test_workspace_is_owned_by_the_agent_uid(agent_reachable_dir: Path) -> None:
    iso = open_isolation(IsolationConfig(), agent_reachable_dir / "state")
    path = iso.workspace_for("echo@local")
    creds = iso.credentials_for("echo@local")
    assert path == agent_reachable_dir / "state" / "workspaces" / "echo@local"
    assert (path.stat().st_uid, path.stat().st_gid, mode(path)) == (creds.uid, creds.gid, 0o700)  # type: ignore[union-attr]
    assert mode(path.parent) == 0o711
    for bad in ("..", "a/b", ""):
        with pytest.raises(LaunchError):
            iso.workspace_for(bad)


def test_socket_discovery_order(home: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    def socket() -> Path:
        # `covenant dispatch` finds it through str functions, everything else through Home: the same file.
        assert Path(socket_file(home_dir(str(home.root)))) == home.socket_path
        return home.socket_path

    assert socket() == home.root / "run" / "covenant.sock"
    home.config_path.write_text('socket = "sockets/c.sock"\n')
    assert socket() == home.root / "sockets" / "c.sock"
    home.config_path.write_text('socket = "/srv/c.sock"\n')
    assert socket() == Path("/srv/c.sock")
    monkeypatch.setenv("RUNTIME_DIRECTORY", "/run/covenant:/run/other")
    assert socket() == Path("/run/covenant/covenant.sock")
    monkeypatch.setenv("COVENANT_SOCKET", "/x/y.sock")
    assert socket() == Path("/x/y.sock")


def test_a_relative_home_is_taken_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COVENANT_HOME", raising=False)
    assert Path(home_dir("h")) == tmp_path / "h" == Home.resolve("h").root
    monkeypatch.setenv("COVENANT_HOME", "./other")
    assert Path(home_dir()) == tmp_path / "other" == Home.resolve().root
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()  # an absolute home needs no working directory
    assert home_dir("/srv/covenant") == "/srv/covenant" and Home.resolve("/srv/covenant").root == Path("/srv/covenant")


LIMITS_AGENT = (
    "import json, os, sys\n"
    "intent = json.loads(sys.stdin.readline())\n"
    "limits = {line[:26].strip(): line[26:].split()[:2] for line in open('/proc/self/limits')}\n"
    "seen = {'uid': os.getuid(), 'groups': os.getgroups(), 'nproc': limits['Max processes'],\n"
    "        'fsize': limits['Max file size'], 'home': os.environ['HOME'], 'home_owner': os.stat(os.environ['HOME']).st_uid}\n"
    "print(json.dumps({'intent_id': intent['id'], 'status': 'ok', 'text': json.dumps(seen), 'sources': []}))\n"
)


@root_only
@pytest.mark.parametrize("helper", [True, False], ids=["exec-helper", "popen-fallback"])
def test_isolated_agents_get_their_limits_and_own_their_home(agent_reachable_dir: Path, helper: bool) -> None:
    """prlimit(2) on another uid's process needs CAP_SYS_RESOURCE: the limits are set while it is root."""
    entry = agent_reachable_dir / "limits.py"
    entry.write_text(LIMITS_AGENT)
    iso = open_isolation(IsolationConfig(max_processes=77, uid_range=agent_uid_range()), agent_reachable_dir / "state")
    config = RuntimeConfig(python3="/usr/bin/python3", pdeathsig=helper)

    async def main():  # type: ignore[no-untyped-def]
        async with Runner.open(config, scratch_root=agent_reachable_dir / "scratch", isolation=iso) as runner:
            # No network: without the exec helper no namespace of its own could give it egress.
            return await runner.run(make_agent(entry, disk_mb=3, network="off"), make_payload("limits"))

    record = trio.run(main)
    assert record.outcome == "ok", record
    seen = json.loads(record.result["text"])  # type: ignore[index]
    assert seen["uid"] == record.uid and seen["groups"] == [] and seen["home_owner"] == record.uid
    assert seen["nproc"] == ["77", "77"] and seen["fsize"] == [str(3 << 20), str(3 << 20)]
