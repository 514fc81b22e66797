"""WorkerThreads: calls run on long-lived named threads, in order; results and errors come back to the
awaiting task; a started call is always collected, even when its caller is cancelled."""

from __future__ import annotations

import threading

import pytest
import trio

from covenant.runtime.launcher import LaunchPlan, ProcessGroupLauncher
from covenant.runtime.pdeathsig import GATE_BYTE
from covenant.runtime.workers import WorkerThreads, on_a_lasting_thread


async def test_calls_run_on_the_named_threads_and_hand_back_results_and_errors() -> None:
    async with WorkerThreads.open(1, "covenant-test") as threads:
        assert await threads.run(lambda: threading.current_thread().name) == "covenant-test-0"
        first = threads.submit(lambda x: x * 2, 21)
        second = threads.submit(int, "not a number")
        await first.wait()
        assert first.result() == 42
        await second.wait()
        with pytest.raises(ValueError):
            second.result()


async def test_result_before_the_call_ended_is_a_mistake() -> None:
    gate = threading.Event()
    async with WorkerThreads.open(1, "covenant-test") as threads:
        job = threads.submit(gate.wait, 10)
        with pytest.raises(RuntimeError, match="await wait"):
            job.result()
        gate.set()
        await job.wait()
        assert job.result() is True


async def test_a_cancelled_caller_still_waits_for_its_started_call() -> None:
    release, finished = threading.Event(), threading.Event()

    def slow() -> str:
        release.wait(10)
        finished.set()
        return "done"

    async with WorkerThreads.open(1, "covenant-test") as threads:
        timer = threading.Timer(0.3, release.set)
        timer.start()
        got: list[str] = []
        with trio.move_on_after(0.05) as scope:
            got.append(await threads.run(slow))  # past its deadline: the wait is shielded
            await trio.sleep(10)  # the cancellation lands here
        timer.join()
    assert got == ["done"] and finished.is_set() and scope.cancelled_caught


async def test_close_joins_after_the_calls_already_submitted() -> None:
    done: list[int] = []
    async with WorkerThreads.open(2, "covenant-test") as threads:
        for n in range(6):
            threads.submit(done.append, n)
    assert sorted(done) == list(range(6))


async def test_only_lasting_threads_may_spawn_processes_that_die_with_covenant() -> None:
    """PR_SET_PDEATHSIG follows the spawning thread: a spawn from trio's thread cache (threads retired
    after 10 s idle) is refused at once instead of killing the process 10 s later."""
    assert on_a_lasting_thread()
    assert not await trio.to_thread.run_sync(on_a_lasting_thread)
    async with WorkerThreads.open(1, "covenant-test") as threads:
        assert await threads.run(on_a_lasting_thread)
    plan = LaunchPlan(argv=("/bin/true",), env={}, cwd="/")
    with pytest.raises(RuntimeError, match="passing thread"):
        await trio.to_thread.run_sync(ProcessGroupLauncher().launch, plan)
    launched = ProcessGroupLauncher().launch(plan)  # the main thread: fine
    try:
        if launched.gated:
            await launched.stdin.send_all(GATE_BYTE)
        with trio.fail_after(30):
            await launched.wait_exit()
        assert launched.reap().exit_code == 0
    finally:
        launched.close()
