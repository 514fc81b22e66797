"""``runtime: container`` tools and ``rune@docker-exec``: real containers by rootful podman (runc) from tiny
images built here from busybox-static (no registry pull), run as the agent's uid with no capabilities, no
network and a read-only root; nothing left behind after a timeout or a flood of output."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest

from covenant.config import Config, IsolationConfig
from covenant.home import Home
from covenant.homeinit import init_home
from covenant.runtime.isolation import open_isolation
from covenant.runtime.podman import ContainerSpec, Podman, home_label, podman_argv
from tests.conftest import agent_uid_range
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of

from .conftest import Tools, _tools

REPO = "localhost/covenant-test"
ECHO, PROBE, SPIN = f"{REPO}/echo:1", f"{REPO}/probe:1", f"{REPO}/spin:1"

_MEMORY_LIMIT = "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"

# What the probe image answers: who it runs as, its capabilities, its interfaces, whether / and /tmp are writable,
# /tmp's size, its memory limit and the document it was given.
_PROBE_SCRIPT = (
    'read -r doc; '
    'caps=$(grep CapEff /proc/self/status | cut -f2); '
    'ifs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " | tr "\\n" " "); '
    'if touch /root-write 2>/dev/null; then root=yes; else root=no; fi; '
    'if echo x > /tmp/t; then tmp=yes; else tmp=no; fi; '
    'tmpkb=$(df -k /tmp | tail -n 1 | tr -s " " | cut -d" " -f2); '
    f'mem=$({_MEMORY_LIMIT}); '
    'cpu=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d" " -f1 /sys/fs/cgroup/cpu.max); '
    'printf \'{"uid":%s,"gid":%s,"caps":"%s","ifaces":"%s","root_writable":"%s","tmp_writable":"%s","tmp_kb":%s,'
    '"memory":%s,"cpu_quota":%s,"doc":%s}\\n\' "$(id -u)" "$(id -g)" "$caps" "$ifs" "$root" "$tmp" "$tmpkb" "$mem" "$cpu" "$doc"'
)


def _needs_podman() -> None:
    missing = [name for name in ("podman", "runc", "busybox") if shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt install podman runc busybox-static)")
    if os.geteuid() != 0:
        pytest.skip("containers run through rootful podman: needs root")


@pytest.fixture(scope="session")
def test_images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The three test images, built once per session from the host's static busybox (FROM scratch: no pull)."""
    _needs_podman()
    busybox = Path(shutil.which("busybox", path="/usr/bin:/bin") or "/bin/busybox")
    with open(busybox, "rb") as f:
        if b"ld-linux" in f.read(4096):
            pytest.skip(f"{busybox} is dynamically linked: needs busybox-static (apt install busybox-static)")
    context = tmp_path_factory.mktemp("images")
    shutil.copy(busybox, context / "busybox")
    entrypoints = {
        ECHO: ["/bin/busybox", "cat"],
        PROBE: ["/bin/sh", "-c", _PROBE_SCRIPT],
        SPIN: ["/bin/sh", "-c", "while :; do :; done"],
    }
    for image, entrypoint in entrypoints.items():
        containerfile = context / f"{image.rsplit('/', 1)[1].split(':')[0]}.Containerfile"
        containerfile.write_text("FROM scratch\nCOPY busybox /bin/busybox\nCOPY busybox /bin/sh\n"
                                 f"ENTRYPOINT {json.dumps(entrypoint)}\n")
        built = subprocess.run(["podman", "build", "--runtime", "runc", "--pull=never", "-q", "-f", str(containerfile),
                                "-t", image, str(context)], capture_output=True, text=True, timeout=120, check=False)
        assert built.returncode == 0, built.stderr
    yield


def _containers_of(intent: str) -> list[str]:
    """Containers (running or not) whose covenant.run label marks a tool run of ``intent``."""
    listed = subprocess.run(
        ["podman", "ps", "--all", "--filter", "label=covenant.run", "--format", '{{.Names}} {{index .Labels "covenant.run"}}'],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return [line for line in listed.stdout.splitlines() if f" {intent}:tool:" in line]


def _processes_of(uid: int) -> list[int]:
    return [p.pid for p in psutil.process_iter(["uids", "status"])
            if p.info["uids"] is not None and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE]


@asynccontextmanager
async def container_tools(home: Home, **container: object) -> AsyncIterator[Tools]:
    """Tools whose agents have uids of their own, with ``[tools.container]`` set to ``container``."""
    init_home(home)
    isolation = open_isolation(IsolationConfig(uid_range=agent_uid_range()), home.state_dir)
    config = Config.model_validate({"runtime": {"kill_grace_ms": 500}, "tools": {"container": container}})
    async with _tools(home, home.root, config, isolation) as made:
        yield made


def _descriptor(name: str, image: str, timeout_ms: int = 10_000, capabilities: str = "") -> str:
    return f"name: {name}\nversion: 0.1.0\nruntime: container\nmodule: {image}\ntimeout_ms: {timeout_ms}\n{capabilities}"


def test_the_podman_command_line_confines_the_container() -> None:
    spec = ContainerSpec(image="localhost/x:1", uid=61200, gid=61200, network="none", memory_mb=256, pids_max=64,
                         tmp_mb=100, marker="i:tool:1", home="0123456789abcdef", cpus=0.5, command=("/bin/sh", "-c", "true"),
                         workspace="/w", name="c1")
    argv = podman_argv(Podman("/usr/bin/podman", "/usr/sbin/runc"), spec)
    joined = " ".join(argv)
    for part in ("--pull never", "--runtime /usr/sbin/runc", "--user 61200:61200", "--network none", "--read-only",
                 "--cap-drop all", "--security-opt no-new-privileges", "--memory 256m", "--memory-swap 256m",
                 "--pids-limit 64", "--ulimit nofile=1024:1024", "--ulimit nproc=1024:1024",
                 "--tmpfs /tmp:rw,size=100m", "--volume /w:/workspace:rw", "--label covenant.run=i:tool:1",
                 "--label covenant.home=0123456789abcdef", "--cpus 0.5"):
        assert part in joined, part
    assert argv[-3:] == ["localhost/x:1", "-c", "true"]
    assert argv[argv.index("--entrypoint") + 1] == "/bin/sh"


@pytest.mark.parametrize("image", ["--privileged", "Upper/case:1", "a b", "x:1@sha256:12"])
def test_an_image_that_is_no_reference_is_a_config_error(image: str) -> None:
    with pytest.raises(ValueError, match="is not an image reference"):
        Config.model_validate({"tools": {"container": {"images": [image]}}})


async def test_container_tools_run_confined_and_leave_nothing(home: Home, test_images: None) -> None:
    async with container_tools(home, images=[ECHO, PROBE, SPIN]) as tools:
        agent = tools.package("boxed", ["echo", "probe", "probe_net", "spin", "unlisted", "noimage", "rune@docker-exec"], {
            "tools/echo.yaml": _descriptor("echo", ECHO),
            "tools/probe.yaml": _descriptor("probe", PROBE),
            "tools/probe_net.yaml": _descriptor("probe_net", PROBE, capabilities="capabilities:\n  - network\n"),
            "tools/spin.yaml": _descriptor("spin", SPIN, timeout_ms=1500),
            "tools/unlisted.yaml": _descriptor("unlisted", f"{REPO}/elsewhere:1"),
            "tools/noimage.yaml": "name: noimage\nversion: 0.1.0\nruntime: container\n",
        })
        reasons = dict(tools.host.unavailable(agent))
        assert "not listed in [tools.container] images" in reasons["unlisted"], reasons
        assert "needs the image reference in module" in reasons["noimage"], reasons
        assert sorted(t["function"]["name"] for t in tools.host.offered(agent)) == ["docker-exec", "echo", "probe", "probe_net", "spin"]
        ctx = tools.ctx(agent, tools.grant("tool.*"))
        uid = tools.runner.isolation.credentials_for(agent.id).uid

        args = {"text": "héllo \u2603", "n": [1, 2.5, None], "nested": {"ok": True}}
        echoed = await tools.host.call(ctx, "echo", json.dumps(args))
        assert echoed.ok and echoed.content == args, echoed

        probed = await tools.host.call(ctx, "probe", {"asked": 1})
        assert probed.ok, probed
        facts = probed.content
        assert (facts["uid"], facts["gid"]) == (uid, uid)
        assert facts["caps"] == "0000000000000000"
        assert facts["ifaces"].split() == ["lo"]
        assert (facts["root_writable"], facts["tmp_writable"]) == ("no", "yes")
        assert facts["tmp_kb"] == agent.resources.disk_mb * 1024
        assert facts["doc"] == {"asked": 1}
        assert facts["memory"] == 256 * 1024 * 1024  # resource_profile small ([rune] memory_small_mb), not memory_mb
        assert facts["cpu_quota"] == 50_000  # its CPU share, [rune] cpu_small = 0.5 cores of a 100 ms period

        # declaring network: the agent's own namespace (its slirp4netns tap), never the host's interfaces
        netted = await tools.host.call(ctx, "probe_net", {"asked": 2})
        assert netted.ok, netted
        assert "lo" in netted.content["ifaces"].split() and "tap0" in netted.content["ifaces"].split(), netted.content
        assert netted.content["uid"] == uid

        spun = await tools.host.call(ctx, "spin", {})
        assert (spun.ok, spun.error_code) == (False, "tool_timeout"), spun

        # docker-exec: the command's exit code and both streams; odd arguments refused before anything runs
        ran = await tools.host.call(ctx, "docker-exec", {"command": "id -u; echo out; echo err >&2; exit 3",
                                                         "image": PROBE})
        assert ran.ok, ran
        assert (ran.content["exit_code"], ran.content["stdout"], ran.content["stderr"]) == (3, f"{uid}\nout\n", "err\n")
        assert ran.content["image"] == PROBE
        default = await tools.host.call(ctx, "docker-exec", {"command": _MEMORY_LIMIT})
        assert default.ok and default.content["image"] == ECHO, default
        assert default.content["stdout"] == f"{256 * 1024 * 1024}\n"  # the profile's memory here too
        unlisted = await tools.host.call(ctx, "docker-exec", {"command": "true", "image": "docker.io/library/ubuntu:latest"})
        assert (unlisted.ok, unlisted.error_code) == (False, "tool_unavailable"), unlisted
        assert "not listed" in unlisted.error_message
        into = await tools.host.call(ctx, "docker-exec", {"command": "true", "container_id": "abc"})
        assert (into.ok, into.error_code) == (False, "invalid_arguments"), into

        assert [e["outcome"] for e in tools.audit.of("tool.call")] == ["ok", "ok", "ok", "error", "ok", "ok", "error", "error"]
        assert _containers_of(ctx.intent_id) == []
        assert _processes_of(uid) == []


async def test_docker_exec_timeout_and_flood_remove_the_container(home: Home, test_images: None) -> None:
    async with container_tools(home, images=[ECHO], timeout_ms=1500, output_max_bytes=1024) as tools:
        agent = tools.package("execer", ["rune@docker-exec"])
        ctx = tools.ctx(agent, tools.grant("tool.docker_exec"))
        uid = tools.runner.isolation.credentials_for(agent.id).uid
        slept = await tools.host.call(ctx, "docker-exec", {"command": "sleep 60"})
        assert (slept.ok, slept.error_code) == (False, "tool_timeout"), slept
        flood = await tools.host.call(ctx, "docker-exec", {"command": "yes covenant"})
        assert flood.ok, flood
        assert flood.content["stdout_truncated"] is True
        assert len(flood.content["stdout"]) == 1024 and flood.content["exit_code"] is None
        assert _containers_of(ctx.intent_id) == []
        assert _processes_of(uid) == []


async def test_without_images_listed_container_tools_are_unavailable(home: Home) -> None:
    _needs_podman()
    async with container_tools(home) as tools:
        agent = tools.package("bare", ["rune@docker-exec", "boxed"], {"tools/boxed.yaml": _descriptor("boxed", ECHO)})
        reasons = dict(tools.host.unavailable(agent))
        assert "no image is listed in [tools.container] images" in reasons["rune@docker-exec"], reasons
        assert "no image is listed" in reasons["boxed"], reasons
        assert tools.host.offered(agent) == []


def test_a_daemon_offers_and_runs_container_tools_and_docker_exec(
    daemon: DaemonProcess, fake_model: FakeModelServer, test_images: None
) -> None:
    """Through a real daemon and replica: tools list says what runs, the model's calls run in containers as the
    agent's uid, the audit has each call, and no container outlives the intent."""
    package = add_rune_agent(daemon, "boxer", toolset=("rune@docker-exec", "echo", "stray"))
    tools_dir = package / "tools"
    tools_dir.mkdir(mode=0o755)
    for name, image in (("echo", ECHO), ("stray", f"{REPO}/stray:1")):
        (tools_dir / f"{name}.yaml").write_text(_descriptor(name, image))
        (tools_dir / f"{name}.yaml").chmod(0o644)
    configure(daemon, ("fake", fake_model), extra=f'[tools.container]\nimages = ["{ECHO}", "{PROBE}"]\n')
    daemon.start()
    listed = {t["entry"]: t for t in json.loads(daemon.cli("tools", "list", "boxer", "--json", check=True).stdout)["tools"]}
    assert listed["rune@docker-exec"]["available"] is True and listed["echo"]["available"] is True, listed
    assert listed["stray"]["available"] is False and "not listed in [tools.container] images" in listed["stray"]["reason"]

    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(
        Reply.tools(ToolCall("echo", {"q": "ü"}), ToolCall("docker-exec", {"command": "id -u", "image": PROBE})),
        Reply(text="done"),
    )
    outcome = outcome_of(daemon.cli("dispatch", "box it", "--agent", "boxer@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    assert fake_model.requests[0].tool_names == ["docker-exec", "echo"]
    answers = [json.loads(m["content"]) for m in fake_model.requests[1].messages if m["role"] == "tool"]
    assert answers[0] == {"q": "ü"}
    uid = int(answers[1]["stdout"])
    assert uid != 0 and answers[1]["exit_code"] == 0
    events = [json.loads(line)["data"] for line in
              daemon.cli("audit", "tail", "--json", "-n", "1000", "--type", "tool.call", check=True).stdout.splitlines()]
    assert sorted((e["name"], e["outcome"]) for e in events if e["intent"] == outcome["intent_id"]) == [
        ("docker-exec", "ok"), ("echo", "ok")]
    assert _containers_of(outcome["intent_id"]) == []
    assert daemon.stop() == 0
    assert _processes_of(uid) == []


def _containers_labelled(label: str) -> list[str]:
    listed = subprocess.run(["podman", "ps", "--all", "--filter", f"label={label}", "--format", "{{.Names}}"],
                            capture_output=True, text=True, timeout=60, check=True)
    return listed.stdout.split()


def test_containers_of_a_killed_daemon_are_removed_at_its_next_start_and_no_others(
    daemon: DaemonProcess, fake_model: FakeModelServer, test_images: None
) -> None:
    """kill -9 mid-call leaves the container running; the next start removes it (label covenant.home), and a
    container of another home, even one marked as a covenant tool run, is left alone."""
    package = add_rune_agent(daemon, "spinner", toolset=("spin",))
    (package / "tools").mkdir(mode=0o755)
    (package / "tools" / "spin.yaml").write_text(_descriptor("spin", SPIN, timeout_ms=55_000))
    (package / "tools" / "spin.yaml").chmod(0o644)
    configure(daemon, ("fake", fake_model), extra=f'[tools.container]\nimages = ["{SPIN}"]\n')
    ours = f"label=covenant.home={home_label(str(Home(daemon.home).state_dir.resolve()))}"
    other = f"covenant-test-other-{secrets.token_hex(4)}"
    created = subprocess.run(["podman", "create", "--runtime", "runc", "--name", other, "--label",
                              "covenant.home=ffffffffffffffff", "--label", "covenant.run=elsewhere:tool:1", SPIN],
                             capture_output=True, text=True, timeout=60, check=False)
    assert created.returncode == 0, created.stderr
    try:
        daemon.start()
        daemon.cli("grant", "tester@test", "tool.spin", check=True)
        fake_model.script(Reply.tools(ToolCall("spin", {})), Reply(text="never reached"))
        dispatch = daemon.cli_background("dispatch", "spin", "--agent", "spinner@local", "--json")
        deadline = time.monotonic() + 60
        while not _containers_labelled(ours.removeprefix("label=")) and time.monotonic() < deadline:
            time.sleep(0.1)
        [left] = _containers_labelled(ours.removeprefix("label="))
        daemon.stop(signal.SIGKILL)
        dispatch.communicate(timeout=60)
        assert _containers_labelled(ours.removeprefix("label=")) == [left]  # the dead daemon could not remove it

        daemon.start()
        assert _containers_labelled(ours.removeprefix("label=")) == []
        assert other in _containers_labelled("covenant.home=ffffffffffffffff")
        sweeps = [json.loads(line)["data"] for line in daemon.cli(
            "audit", "tail", "--json", "-n", "1000", "--type", "isolation.sweep", check=True).stdout.splitlines()]
        assert sweeps[-1]["containers"] == [left], sweeps
        # The dead daemon's podman client for that container ends with it.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                left in (p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])):
            time.sleep(0.1)
        assert not any(left in (p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
        assert daemon.stop() == 0
    finally:
        subprocess.run(["podman", "rm", "--force", "--time", "0", other], capture_output=True, timeout=60, check=False)
