"""The spawn path: the PDEATHSIG helper and the on_spawned hook, with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from covenant.config import RuntimeConfig
from covenant.runtime import host
from covenant.runtime.isolation import Isolation
from covenant.runtime.pdeathsig import GATE_BYTE, helper_elf
from covenant.runtime.runner import Runner
from tests.processes import alive, wait_gone
from tests.runtime.conftest import leftovers, make_agent, make_payload

REPO = Path(__file__).resolve().parents[2]


def wait_in_sleep(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` sleeps in nanosleep (its kernel wait channel), i.e. runs its own code."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/wchan") as f:
                if "nanosleep" in f.read():
                    return True
        except OSError:
            return False
        time.sleep(0.01)
    return False


def write_helper(tmp_path: Path, parent_pid: int) -> str:
    image = helper_elf(parent_pid)
    if image is None:
        pytest.skip("the static PDEATHSIG helper exists for x86-64 only (setpriv elsewhere)")
    path = tmp_path / "pdeathsig"
    path.write_bytes(image)
    path.chmod(0o755)
    return str(path)


def test_helper_execs_with_argv_and_environment(tmp_path: Path) -> None:
    helper = write_helper(tmp_path, os.getpid())
    done = subprocess.run(
        [helper, "/bin/sh", "-c", 'echo "$0 $1 $SEEN"; exit 3', "zero", "one"],
        env={"SEEN": "yes"},
        input=GATE_BYTE,
        capture_output=True,
    )
    assert done.returncode == 3 and done.stdout == b"zero one yes\n"
    assert subprocess.run([helper, str(tmp_path / "missing")], input=GATE_BYTE).returncode == 127


def test_helper_consumes_exactly_the_gate_byte(tmp_path: Path) -> None:
    helper = write_helper(tmp_path, os.getpid())
    done = subprocess.run([helper, "/bin/cat"], input=GATE_BYTE + b"the intent line\n", capture_output=True)
    assert done.returncode == 0 and done.stdout == b"the intent line\n"


def test_helper_waits_at_the_gate_and_runs_nothing_until_released(tmp_path: Path) -> None:
    helper = write_helper(tmp_path, os.getpid())
    marker = tmp_path / "ran"
    process = subprocess.Popen([helper, "/bin/sh", "-c", f"touch {marker}"], stdin=subprocess.PIPE)
    assert process.stdin is not None
    # Blocked in read(2) on its stdin: still the helper, and the agent has not run.
    deadline = time.monotonic() + 30
    while psutil.Process(process.pid).status() != psutil.STATUS_SLEEPING and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert process.poll() is None and not marker.exists()
    assert psutil.Process(process.pid).exe().startswith(str(helper))
    process.stdin.write(GATE_BYTE)
    process.stdin.close()
    assert process.wait(timeout=30) == 0 and marker.exists()


def test_helper_withdrawn_at_the_gate_kills_itself_without_exec(tmp_path: Path) -> None:
    helper = write_helper(tmp_path, os.getpid())
    marker = tmp_path / "ran"
    done = subprocess.run([helper, "/bin/sh", "-c", f"touch {marker}"], stdin=subprocess.DEVNULL)
    assert done.returncode == -signal.SIGKILL and not marker.exists()


def test_helper_refuses_when_its_parent_is_not_the_supervisor(tmp_path: Path) -> None:
    # Built for another pid: as if covenant had died between spawn and prctl.
    helper = write_helper(tmp_path, os.getpid() + 1)
    done = subprocess.run([helper, "/bin/echo", "ran"], input=GATE_BYTE, capture_output=True)
    assert done.returncode == -signal.SIGKILL and done.stdout == b""


def test_runner_uses_the_cheap_wrapper() -> None:
    wrapper = host.pdeathsig_wrapper()
    assert wrapper is not None
    if helper_elf(os.getpid()) is not None:
        assert wrapper.argv == (f"/proc/{os.getpid()}/fd/{wrapper.argv[0].rsplit('/', 1)[1]}",)
        assert wrapper.gated


SUPERVISOR = textwrap.dedent(
    """
    import sys, trio
    from functools import partial
    from pathlib import Path
    from covenant.config import RuntimeConfig
    from covenant.runtime.runner import Runner
    from tests.runtime.conftest import make_agent, make_payload

    async def main():
        async def spawned(info):
            print(info["pid"], flush=True)
        config = RuntimeConfig(pdeathsig=sys.argv[2] == "on")
        agent = make_agent("fault.py", cpu_ms_per_task=60000)
        async with Runner.open(config, scratch_root=Path(sys.argv[1])) as runner:
            # The first agent is spawned from the loop thread, the second (with one
            # in flight) from a spawn thread: PDEATHSIG must hold for both.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(runner.run, on_spawned=spawned), agent, make_payload("sleep"))
                while runner.in_flight < 1:
                    await trio.sleep(0.01)
                nursery.start_soon(partial(runner.run, on_spawned=spawned), agent, make_payload("sleep"))

    trio.run(main)
    """
)


@pytest.mark.parametrize("pdeathsig", ["on", "off"])
def test_agent_dies_with_its_supervisor(tmp_path: Path, pdeathsig: str) -> None:
    """SIGKILL the supervising process: with PDEATHSIG the agent dies too; without, it survives."""
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(tmp_path / "scratch"), pdeathsig],
        cwd=REPO,
        stdout=subprocess.PIPE,
    )
    pids: list[int] = []
    try:
        assert supervisor.stdout is not None
        pids = [int(supervisor.stdout.readline()) for _ in range(2)]
        for pid in pids:  # released and running: past reading its intent, in time.sleep
            assert wait_in_sleep(pid, 30), f"agent {pid} never got to its sleep"
        supervisor.kill()
        supervisor.wait()
        if pdeathsig == "on":
            assert all(wait_gone(pid, 10) for pid in pids), "an agent outlived its supervisor"
        else:
            time.sleep(0.3)
            assert all(alive(pid) for pid in pids), "control: without PDEATHSIG the orphans keep running"
    finally:
        supervisor.kill()
        supervisor.wait()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


async def test_spawn_hook_sees_the_live_process(runner: Runner) -> None:
    payload = make_payload("sleep")
    seen: list[dict[str, Any]] = []

    async def spawned(info: dict[str, Any]) -> None:
        proc = psutil.Process(info["pid"])
        assert proc.status() != psutil.STATUS_ZOMBIE
        # The hook may run while the exec chain (helper -> interpreter) is still going.
        with trio.fail_after(10):
            while proc.environ().get("COVENANT_INTENT_ID") != payload["id"]:
                await trio.sleep(0.01)
        assert alive(info["pid"])
        seen.append(info)

    record = await runner.run(make_agent("fault.py", cpu_ms_per_task=300), payload, on_spawned=spawned)
    assert record.outcome == "timeout"
    assert seen == [{"pid": record.pid, "argv": record.argv, "limits": record.limits}]
    assert all(isinstance(v, (int, str)) for v in seen[0]["limits"].values())
    assert all(isinstance(a, str) for a in seen[0]["argv"])


async def test_agent_waits_at_its_gate_until_the_hook_returns(tmp_path: Path) -> None:
    """Behind the gated helper the agent is not even exec'd while the hook runs (it audits the spawn)."""
    seen: list[list[str]] = []

    async def slow(info: dict[str, Any]) -> None:
        process = psutil.Process(info["pid"])
        with trio.fail_after(10):
            while not process.cmdline():  # empty for an instant right after exec on a loaded box
                await trio.sleep(0.01)
        for _ in range(3):
            seen.append(process.cmdline())
            await trio.sleep(0.4)

    # Wall-clock budget = 1,000 ms of CPU budget + no grace; the hook takes 1.2 s.
    # In the host's network: no `unshare -n` in front of the helper (its argv is what is counted).
    async with Runner.open(RuntimeConfig(wall_grace_ms=0), scratch_root=tmp_path, isolation=Isolation.same_uid(network="host")) as runner:
        record = await runner.run(make_agent("fault.py", cpu_ms_per_task=1000, network="full"), make_payload("echo fast"),
                                  on_spawned=slow)
    assert record.outcome == "ok" and record.result and record.result["text"] == "fast"
    # Still the helper (its argv is the whole wrapped command line) 0.8 s in, and the hook took
    # longer than the agent's whole wall-clock budget: that budget starts at release.
    assert seen == [record.argv] * 3 and len(record.argv) == 3


async def test_ungated_agent_gets_its_intent_only_after_the_hook(tmp_path: Path) -> None:
    """Without the helper (pdeathsig off) the process runs, but its intent line waits for the hook."""
    stdout_during_hook: list[str] = []

    async def slow(info: dict[str, Any]) -> None:
        await trio.sleep(0.3)
        stdout_during_hook.append(psutil.Process(info["pid"]).status())

    async with Runner.open(RuntimeConfig(pdeathsig=False), scratch_root=tmp_path, isolation=Isolation.same_uid(network="host")) as runner:
        record = await runner.run(make_agent("fault.py", network="full"), make_payload("echo fast"), on_spawned=slow)
    assert record.outcome == "ok" and record.result and record.result["text"] == "fast"
    assert len(record.argv) == 2  # no wrapper
    assert stdout_during_hook == [psutil.STATUS_SLEEPING]  # blocked reading its stdin


@pytest.mark.parametrize("pdeathsig", [True, False], ids=["gated", "ungated"])
async def test_agent_runs_on_every_cpu_of_its_supervisor(tmp_path: Path, pdeathsig: bool) -> None:
    """While other runs are in flight the spawning thread is pinned to its CPU for the vfork only:
    neither it nor the agent keeps the pin. A lone run is spawned unpinned."""
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing is pinned")
    agent = make_agent("fault.py")
    async with Runner.open(RuntimeConfig(pdeathsig=pdeathsig), scratch_root=tmp_path) as runner:
        alone = await runner.run(agent, make_payload("cpus"))
        sleeper = make_payload("sleep")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run, agent, sleeper)
            with trio.fail_after(30):
                while runner.in_flight == 0:
                    await trio.sleep(0.01)
            beside = [await runner.run(agent, make_payload("cpus")) for _ in range(3)]
            assert runner.cancel(sleeper["id"], "the test is over")
    assert [json.loads(r.result["text"]) for r in [alone, *beside] if r.result] == [sorted(cpus)] * 4
    assert os.sched_getaffinity(0) == cpus


class AuditUnwritable(Exception):
    pass


@pytest.mark.parametrize("pdeathsig", [True, False], ids=["gated", "ungated"])
@pytest.mark.parametrize("text", ["sleep", "stubborn", "escape stay"])
async def test_failing_hook_stops_the_agent_and_raises(tmp_path: Path, text: str, pdeathsig: bool) -> None:
    payload = make_payload(text)
    pids: list[int] = []

    async def spawned(info: dict[str, Any]) -> None:
        pids.append(info["pid"])
        await trio.sleep(0.2)  # ungated: the interpreter is up by now, waiting for its intent
        raise AuditUnwritable("audit log: EIO on fdatasync")

    started = time.monotonic()
    async with Runner.open(RuntimeConfig(kill_grace_ms=500, pdeathsig=pdeathsig), scratch_root=tmp_path) as runner:
        with pytest.raises(AuditUnwritable, match="EIO"):
            await runner.run(make_agent("fault.py", cpu_ms_per_task=30000), payload, on_spawned=spawned)
        assert runner.in_flight == 0
    assert time.monotonic() - started < 10
    assert pids and not alive(pids[0])
    assert leftovers(payload["id"]) == []


async def test_cancelled_caller_cancels_the_hook(tmp_path: Path) -> None:
    payload = make_payload("sleep")

    async def forever(info: dict[str, Any]) -> None:
        await trio.sleep_forever()

    async with Runner.open(RuntimeConfig(kill_grace_ms=300), scratch_root=tmp_path) as runner:
        with trio.move_on_after(0.5) as scope:
            await runner.run(make_agent("fault.py"), payload, on_spawned=forever)
        assert scope.cancelled_caught and runner.in_flight == 0
    assert leftovers(payload["id"]) == []


async def test_run_cancelled_while_the_hook_runs_never_releases_the_agent(tmp_path: Path) -> None:
    """cancel_all (daemon drain timeout) during the spawn hook: the agent is never exec'd."""
    marker = tmp_path / "started"
    entry = tmp_path / "agent.sh"  # started as a binary: it marks as soon as it runs
    entry.write_text(f"#!/bin/sh\ntouch {marker}\nsleep 5\n")
    entry.chmod(0o755)
    payload = make_payload("anything")

    # An ignored SIGTERM is inherited across exec: a released agent would outlive the ladder's
    # SIGTERM and have the whole grace period to mark; a withdrawn helper kills itself at once.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        async with Runner.open(RuntimeConfig(kill_grace_ms=1000), scratch_root=tmp_path / "scratch",
                               isolation=Isolation.same_uid(network="host")) as runner:
            async def spawned(info: dict[str, Any]) -> None:
                runner.cancel_all()

            record = await runner.run(make_agent(entry, runtime="rust-bin", network="full"), payload, on_spawned=spawned)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert record.outcome == "cancelled"
    assert len(record.argv) == 2  # behind the gated helper
    assert not marker.exists()
    assert leftovers(payload["id"]) == []
