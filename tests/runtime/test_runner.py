"""The fault corpus: real agent processes, each checked for its outcome, a prompt
return and that no process of the dispatch survives."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import trio

from covenant.config import RuntimeConfig
from covenant.runtime.host import network_isolation_available, set_child_subreaper
from covenant.runtime.isolation import Isolation
from covenant.runtime.launcher import Launched, LaunchPlan, ProcessGroupLauncher
from covenant.runtime.runner import Runner
from tests.runtime.conftest import leftovers, make_agent, make_payload

FAULT = "fault.py"


async def run_fault(runner: Runner, text: str, **resources: object):
    payload = make_payload(text)
    started = time.monotonic()
    record = await runner.run(make_agent(FAULT, **resources), payload)
    elapsed = time.monotonic() - started
    assert record.intent_id == payload["id"]
    assert leftovers(payload["id"]) == [], "a process of the dispatch survived"
    assert runner.in_flight == 0
    return record, elapsed


async def test_ok_round_trip(runner: Runner) -> None:
    record, elapsed = await run_fault(runner, "echo hello there")
    assert record.outcome == "ok" and record.error is None and record.left_behind == 0
    assert record.result is not None and record.result["text"] == "hello there"
    assert record.exit_code == 0 and record.signal is None and record.pid
    assert record.cpu_ms > 0  # from wait4: there even for a run no sample saw
    assert record.argv[-1].endswith(FAULT) and record.limits["memory_mb"] == 512
    assert record.started_at.endswith("Z") and len(record.started_at) == 24
    assert elapsed < 10


async def test_a_run_shorter_than_a_sample_has_its_peak_read_when_it_answers(
    tmp_path: Path, runtime_config: RuntimeConfig
) -> None:
    """Read when its answer arrives, not left to the next tick. (An agent that exits before covenant reads
    its answer, and before any tick, has released its memory already: its peak_rss_kib is 0.)"""
    no_ticks = runtime_config.model_copy(update={"sample_interval_ms": 10_000})  # the run takes ~0.6 s
    async with Runner.open(no_ticks, scratch_root=tmp_path / "scratch") as runner:
        record, _ = await run_fault(runner, "echo-linger hello")
        assert runner.sampler.ticks == 0
    assert record.outcome == "ok" and record.peak_rss_kib > 1024


async def test_agent_error(runner: Runner) -> None:
    record, _ = await run_fault(runner, "error")
    assert record.outcome == "agent_error" and record.result and record.result["status"] == "error"


async def test_sleep_forever_times_out(runner: Runner) -> None:
    record, elapsed = await run_fault(runner, "sleep", cpu_ms_per_task=300)
    assert record.outcome == "timeout" and "wall-clock" in (record.error or "")
    assert record.limits["wall_ms"] == 300 + 500
    assert 0.7 < elapsed < 10


@pytest.mark.parametrize("runtime_config", [RuntimeConfig(kill_grace_ms=500, wall_grace_ms=5000)])
async def test_after_cancel_all_a_run_that_was_still_starting_is_cancelled(runner: Runner) -> None:
    """A drain's cancel_all can come while a run is claiming its uid or spawning: that run must not start
    its agent afterwards and run to its own timeout (it did, under load; the drain then waited for it)."""
    runner.cancel_all()
    payload = make_payload("echo never")
    record = await runner.run(make_agent(FAULT), payload)
    assert record.outcome == "cancelled" and record.result is None, record
    assert "shutting down" in (record.error or "")
    assert leftovers(payload["id"]) == []


class CancellingLauncher(ProcessGroupLauncher):
    """The real launcher; just before it spawns, ``covenant cancel``-style cancellation of the run arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.runner: Runner | None = None
        self.intent_id = ""
        self.answered: list[bool] = []

    def launch(self, plan: LaunchPlan) -> Launched:
        assert self.runner is not None
        self.answered.append(self.runner.cancel(self.intent_id, "the A2A client canceled the task"))
        return super().launch(plan)


async def test_a_run_cancelled_while_it_is_still_starting_never_releases_its_agent(
    tmp_path: Path, runtime_config: RuntimeConfig
) -> None:
    """A single cancel (an A2A tasks/cancel) can come while the run claims its uid or spawns: it must be
    taken, not answered "not running" while the agent then runs to its end."""
    launcher = CancellingLauncher()
    async with Runner.open(runtime_config, scratch_root=tmp_path / "scratch", launcher=launcher) as runner:
        launcher.runner = runner
        payload = make_payload("echo never")
        launcher.intent_id = payload["id"]
        record = await runner.run(make_agent(FAULT), payload)
        assert launcher.answered == [True]
        assert record.outcome == "cancelled" and record.result is None, record
        assert record.error == "the A2A client canceled the task"
        assert leftovers(payload["id"]) == []
        assert not runner.cancel(payload["id"], "too late"), "a run that ended is not cancelled"


async def test_busy_loop_exceeds_cpu(tmp_path: Path) -> None:
    # A wall-clock grace far beyond the CPU budget: on a loaded box the loop gets a fraction of a CPU,
    # and its CPU budget must still be what ends it, not the wall clock.
    async with Runner.open(RuntimeConfig(wall_grace_ms=60_000), scratch_root=tmp_path / "scratch") as runner:
        record, _ = await run_fault(runner, "busy", cpu_ms_per_task=500)
    assert record.outcome == "cpu_exceeded", record.error
    assert record.cpu_ms >= 500 and "CPU" in (record.error or "")


async def test_memory_over_limit(runner: Runner) -> None:
    record, elapsed = await run_fault(runner, "alloc 128", memory_mb=48)
    assert record.outcome == "memory_exceeded", record.error
    assert record.peak_rss_kib > 48 * 1024
    assert "memory_mb = 48" in (record.error or "")
    assert elapsed < 10


async def test_stdout_flood_is_capped(runner: Runner) -> None:
    me = psutil.Process()
    before = me.memory_info().rss
    record, elapsed = await run_fault(runner, "flood-stdout 100")
    assert record.outcome == "output_too_large"
    cap = runner.config.stdout_cap_bytes
    assert cap < record.stdout_bytes <= cap + 2 * 65536
    assert me.memory_info().rss - before < 32 * 1024 * 1024
    assert elapsed < 10


async def test_stderr_flood_does_not_deadlock(runner: Runner) -> None:
    record, elapsed = await run_fault(runner, "flood-stderr 10")
    assert record.outcome == "ok" and record.result and record.result["text"] == "survived"
    assert 0 < len(record.stderr_tail.encode()) <= runner.config.stderr_tail_bytes
    assert elapsed < 20


@pytest.fixture
async def patient_runner(tmp_path: Path) -> AsyncIterator[Runner]:
    """A grace of 5 s after SIGTERM: room for an agent that exits on it, however loaded the box."""
    async with Runner.open(RuntimeConfig(kill_grace_ms=5000), scratch_root=tmp_path) as runner:
        yield runner


async def test_output_written_during_the_kill_ladder_is_read(patient_runner: Runner) -> None:
    """On SIGTERM the agent writes 256 KiB on stderr (a pipe holds 64) and exits: covenant reads the pipes during
    the grace, so the agent is not blocked on a full pipe until SIGKILL."""
    record, elapsed = await run_fault(patient_runner, "farewell 256", cpu_ms_per_task=300)
    assert record.outcome == "timeout"
    assert "ignored SIGTERM" not in (record.error or "")
    assert record.exit_code == 0 and record.signal is None
    assert record.stderr_tail.endswith("farewell done\n")
    assert elapsed < 10


async def test_the_kill_ladder_sends_sigterm_once(patient_runner: Runner) -> None:
    """The root is signalled through its process group; it is not signalled a second time as a tree member."""
    record, _ = await run_fault(patient_runner, "count-term", cpu_ms_per_task=300)
    assert record.outcome == "timeout" and record.exit_code == 0
    assert record.stderr_tail.count("got SIGTERM") == 1


async def test_an_agent_that_closes_its_pipes_and_stays_is_timed_out(runner: Runner) -> None:
    """Both pipes end long before the process does: the run still waits for its exit or its budget."""
    record, elapsed = await run_fault(runner, "close-pipes", cpu_ms_per_task=300)
    assert record.outcome == "timeout" and record.signal == signal.SIGTERM
    assert record.stdout_bytes == 0 and elapsed < 10
    assert record.duration_ms >= record.limits["wall_ms"]  # its whole budget, not cut short at the pipes' end


async def test_an_intent_larger_than_the_pipe_is_fed_whole(runner: Runner) -> None:
    text = "y" * (300 * 1024)
    record, _ = await run_fault(runner, f"echo {text}")
    assert record.outcome == "ok" and record.result is not None
    assert record.result["text"] == text


async def test_every_stderr_line_is_logged_with_the_last_unended_one(
    runner: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="covenant.agent")
    record, _ = await run_fault(runner, "unended")
    assert record.outcome == "ok"
    lines = [r.line for r in caplog.records if r.getMessage() == "agent stderr" and r.intent == record.intent_id]
    assert lines == ["first line", "last words"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("garbage", "not a JSON line"),
        ("deep", "nests objects and arrays deeper than 64 levels"),
        ("two-lines", "2 non-empty lines"),
        ("wrong-id", "does not echo"),
        ("wrong-shape", "lacks sources"),
    ],
)
async def test_protocol_errors(runner: Runner, text: str, needle: str) -> None:
    record, _ = await run_fault(runner, text)
    assert record.outcome == "protocol_error"
    assert needle in (record.error or "") and record.result is None


async def test_silent_exit_is_no_result(runner: Runner) -> None:
    record, _ = await run_fault(runner, "silent")
    assert record.outcome == "no_result" and record.exit_code == 0


async def test_non_zero_exit_is_crashed(runner: Runner) -> None:
    record, _ = await run_fault(runner, "exit 3")
    assert record.outcome == "crashed" and record.exit_code == 3 and "code 3" in (record.error or "")


@pytest.fixture(params=[False, True], ids=["plain", "subreaper"])
def subreaper(request: pytest.FixtureRequest):
    """Run once as a plain parent and once as a child subreaper (the daemon's mode)."""
    if request.param:
        set_child_subreaper(True)
    yield request.param
    if request.param:
        set_child_subreaper(False)


@pytest.mark.parametrize("stay", [False, True], ids=["agent-exits", "agent-stays"])
async def test_setsid_grandchild_is_killed(subreaper: bool, tmp_path: Path, stay: bool) -> None:
    async with Runner.open(RuntimeConfig(kill_grace_ms=300), scratch_root=tmp_path) as runner:
        resources = {"cpu_ms_per_task": 1000} if stay else {}
        record, elapsed = await run_fault(runner, "escape stay" if stay else "escape", **resources)
    assert record.outcome == ("timeout" if stay else "ok")
    assert record.left_behind == 2, "the setsid child and its grandchild, killed after the agent ended"
    assert elapsed < 15


async def test_sigterm_ignored_gets_sigkill(runner: Runner) -> None:
    record, elapsed = await run_fault(runner, "stubborn", cpu_ms_per_task=300)
    assert record.outcome == "timeout"
    assert "ignored SIGTERM" in (record.error or "")
    assert "ignoring SIGTERM" in record.stderr_tail
    assert record.signal == 9
    assert elapsed < 10


async def test_missing_interpreter(tmp_path: Path) -> None:
    config = RuntimeConfig(python3="/nonexistent/python3")
    async with Runner.open(config, scratch_root=tmp_path) as runner:
        record, _ = await run_fault(runner, "echo x")
    assert record.outcome == "spawn_failed" and record.pid is None
    assert "/nonexistent/python3" in (record.error or "") and "runtime.python3" in (record.error or "")


async def test_missing_entry(runner: Runner, tmp_path: Path) -> None:
    record = await runner.run(make_agent(tmp_path / "gone.py"), make_payload("x"))
    assert record.outcome == "spawn_failed" and "does not exist" in (record.error or "")


async def test_rust_entry_not_executable(runner: Runner, tmp_path: Path) -> None:
    entry = tmp_path / "agent"
    entry.write_text("#!/bin/sh\n")
    record = await runner.run(make_agent(entry, runtime="rust-bin"), make_payload("x"))
    assert record.outcome == "spawn_failed" and "not executable" in (record.error or "")


async def test_file_larger_than_disk_mb(runner: Runner) -> None:
    record, _ = await run_fault(runner, "bigfile 20", disk_mb=5)
    # Python ignores SIGXFSZ, so the write fails with EFBIG and the agent dies of it.
    assert record.outcome == "crashed"
    assert "File too large" in record.stderr_tail
    assert record.scratch_peak_bytes <= 5 * 1024 * 1024
    assert record.limits["disk_mb"] == 5


async def test_scratch_dir_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "scratch"
    async with Runner.open(RuntimeConfig(), scratch_root=root) as runner:
        record, _ = await run_fault(runner, "bigfile 2")
        assert record.outcome == "ok" and record.scratch_peak_bytes == 2 * 1024 * 1024
        # A dir with files is measured and removed before the record exists; what is
        # left are fresh spares and empty dirs queued for removal, never a file.
        assert [p for p in root.rglob("*") if not p.is_dir()] == []
        record, _ = await run_fault(runner, "env")
        home = json.loads(record.result["text"])["HOME"] if record.result else ""
        assert home.startswith(str(root)) and record.scratch_peak_bytes == 0
    assert not os.path.exists(home)
    assert list(root.iterdir()) == []


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock.getsockname()[1]
    sock.close()


async def test_network_off_cannot_reach_host_loopback(runner: Runner, listener: int, tmp_path: Path) -> None:
    if not network_isolation_available():
        pytest.skip("this host cannot create network namespaces (covered by the refusal test)")
    record, _ = await run_fault(runner, f"connect {listener}", network="off")
    assert record.network_enforced
    assert record.outcome == "agent_error" and record.result and record.result["text"].startswith("refused")
    # With network, an agent of covenant's own uid could only run in the host's network: refused
    # unless [isolation] network = "host" accepts that, and then it reaches the host.
    refused, _ = await run_fault(runner, f"connect {listener}", network="full")
    assert refused.outcome == "spawn_failed" and '[isolation] network = "host"' in (refused.error or "")
    async with Runner.open(RuntimeConfig(), scratch_root=tmp_path / "host-network",
                           isolation=Isolation.same_uid(network="host")) as host_network:
        control, _ = await run_fault(host_network, f"connect {listener}", network="full")
    assert control.outcome == "ok" and not control.network_enforced


async def test_secret_env_does_not_leak(runner: Runner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COVENANT_TEST_SECRET", "hunter2")
    monkeypatch.setenv("ALLOWED_NAME", "visible")
    config = RuntimeConfig(env_allow=("ALLOWED_NAME",), env={"FIXED": "1"})
    async with Runner.open(config, scratch_root=tmp_path / "s") as r:
        record, _ = await run_fault(r, "env")
    assert record.result is not None
    env = json.loads(record.result["text"])
    assert "COVENANT_TEST_SECRET" not in env and "hunter2" not in record.result["text"]
    assert env["ALLOWED_NAME"] == "visible" and env["FIXED"] == "1"
    assert env["PATH"] == config.path and env["HOME"] == env["TMPDIR"]
    assert env["HOME"].startswith(str(tmp_path / "s"))
    assert env["COVENANT_AGENT_ID"] == "fault@test" and env["COVENANT_INTENT_ID"] == record.intent_id
    assert env["LANG"] == "C.UTF-8" and env["TZ"] == "UTC"


async def test_priority_sets_nice(runner: Runner) -> None:
    payload = make_payload("nice")
    record = await runner.run(make_agent(FAULT, priority="low"), payload)
    assert record.result and record.result["text"] == "10" and record.limits["nice"] == 10


async def test_cancel_all_leaves_nothing(runner: Runner) -> None:
    payloads = [make_payload("sleep"), make_payload("stubborn")]
    records = []

    async def one(payload: dict) -> None:
        records.append(await runner.run(make_agent(FAULT), payload))

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        for payload in payloads:
            nursery.start_soon(one, payload)
        while runner.in_flight < 2:
            await trio.sleep(0.01)
        await trio.sleep(0.3)
        runner.cancel_all()
    assert time.monotonic() - started < 10
    assert sorted(r.outcome for r in records) == ["cancelled", "cancelled"]
    for payload in payloads:
        assert leftovers(payload["id"]) == []


async def test_trio_cancellation_tears_down(runner: Runner) -> None:
    payload = make_payload("escape stay")
    with trio.move_on_after(0.8) as scope:
        await runner.run(make_agent(FAULT), payload)
    assert scope.cancelled_caught
    assert leftovers(payload["id"]) == []
    assert runner.in_flight == 0


async def test_closing_the_runner_stops_runs(tmp_path: Path) -> None:
    payload = make_payload("sleep")
    records = []
    async with trio.open_nursery() as nursery:
        async with Runner.open(RuntimeConfig(kill_grace_ms=200), scratch_root=tmp_path) as r:

            async def one() -> None:
                records.append(await r.run(make_agent(FAULT), payload))

            nursery.start_soon(one)
            while r.in_flight < 1:
                await trio.sleep(0.01)
    assert [rec.outcome for rec in records] == ["cancelled"]
    assert leftovers(payload["id"]) == []


async def test_one_sampler_for_all_runs(runner: Runner) -> None:
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(runner.run, make_agent(FAULT, cpu_ms_per_task=400), make_payload("sleep"))
        await trio.sleep(0.5)
        ticks = runner.sampler.ticks
    # ~0.5 s at 50 ms: about ten ticks, not forty.
    assert 3 <= ticks <= 15


async def test_node_agent(runner: Runner) -> None:
    from tests.conftest import require_tool

    require_tool("node")
    payload = make_payload("hello from node")
    record = await runner.run(make_agent("echo.js", runtime="node"), payload)
    assert record.outcome == "ok" and record.result and record.result["sources"] == ["node"]
    assert record.argv[-2] == os.path.realpath(record.argv[-2])


@pytest.fixture(scope="session")
def rust_echo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import subprocess

    from tests.conftest import require_tool

    cargo = require_tool("cargo")
    target = tmp_path_factory.mktemp("echo-rs-target")
    manifest = Path(__file__).parent / "agents" / "echo-rs" / "Cargo.toml"
    subprocess.run([cargo, "build", "--quiet", "--release", "--offline", "--manifest-path", str(manifest),
                    "--target-dir", str(target)], check=True)
    return target / "release" / "echo-rs"


async def test_rust_agent(runner: Runner, rust_echo: Path) -> None:
    record = await runner.run(make_agent(rust_echo, runtime="rust-bin"), make_payload("hello from rust"))
    assert record.outcome == "ok" and record.result and record.result["text"] == "hello from rust"


async def test_rune_agent_is_not_spawnable(runner: Runner) -> None:
    agent = make_agent(FAULT).model_copy(update={"runtime": "rune", "entry": None})
    record = await runner.run(agent, make_payload("x"))
    assert record.outcome == "spawn_failed" and "Rune" in (record.error or "")
