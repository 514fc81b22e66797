"""The spawn path: the PDEATHSIG helper and the on_spawned hook, with real processes."""

from __future__ import annotations

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
from covenant.runtime.pdeathsig import helper_elf
from covenant.runtime.runner import Runner
from tests.runtime.conftest import leftovers, make_agent, make_payload

REPO = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Is ``pid`` running (not gone, not a zombie)?"""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
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
        capture_output=True,
    )
    assert done.returncode == 3 and done.stdout == b"zero one yes\n"
    assert subprocess.run([helper, str(tmp_path / "missing")]).returncode == 127


def test_helper_refuses_when_its_parent_is_not_the_supervisor(tmp_path: Path) -> None:
    # Built for another pid: as if covenant had died between spawn and prctl.
    helper = write_helper(tmp_path, os.getpid() + 1)
    done = subprocess.run([helper, "/bin/echo", "ran"], capture_output=True)
    assert done.returncode == -signal.SIGKILL and done.stdout == b""


def test_runner_uses_the_cheap_wrapper() -> None:
    prefix = host.pdeathsig_wrapper()
    assert prefix is not None
    if helper_elf(os.getpid()) is not None:
        assert prefix == (f"/proc/{os.getpid()}/fd/{prefix[0].rsplit('/', 1)[1]}",)


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
        assert all(alive(pid) for pid in pids)
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


async def test_agent_does_not_wait_for_the_hook(runner: Runner) -> None:
    """The hook runs beside the agent, and run() returns only after the hook finished."""
    finished: list[bool] = []

    async def slow(info: dict[str, Any]) -> None:
        with trio.fail_after(20):
            while alive(info["pid"]):
                await trio.sleep(0.02)  # the agent answers and exits while the hook is still busy
        finished.append(True)

    record = await runner.run(make_agent("fault.py"), make_payload("echo fast"), on_spawned=slow)
    assert record.outcome == "ok" and record.result and record.result["text"] == "fast"
    assert finished == [True]


class AuditUnwritable(Exception):
    pass


@pytest.mark.parametrize("text", ["sleep", "stubborn", "escape stay"])
async def test_failing_hook_tears_down_and_raises(runner: Runner, text: str) -> None:
    payload = make_payload(text)
    pids: list[int] = []

    async def spawned(info: dict[str, Any]) -> None:
        pids.append(info["pid"])
        await trio.sleep(0.2)  # the agent is up and running (or forking) by now
        raise AuditUnwritable("audit log: EIO on fdatasync")

    started = time.monotonic()
    with pytest.raises(AuditUnwritable, match="EIO"):
        await runner.run(make_agent("fault.py", cpu_ms_per_task=30000), payload, on_spawned=spawned)
    assert time.monotonic() - started < 10
    assert pids and not alive(pids[0])
    assert leftovers(payload["id"]) == []
    assert runner.in_flight == 0


async def test_cancelled_caller_cancels_the_hook(tmp_path: Path) -> None:
    payload = make_payload("sleep")

    async def forever(info: dict[str, Any]) -> None:
        await trio.sleep_forever()

    async with Runner.open(RuntimeConfig(kill_grace_ms=300), scratch_root=tmp_path) as runner:
        with trio.move_on_after(0.5) as scope:
            await runner.run(make_agent("fault.py"), payload, on_spawned=forever)
        assert scope.cancelled_caught and runner.in_flight == 0
    assert leftovers(payload["id"]) == []
