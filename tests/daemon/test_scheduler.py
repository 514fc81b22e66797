"""The scheduler: global and per-agent limits, priority order, bounded queue, close."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from covenant.daemon.scheduler import Overloaded, Scheduler, ShuttingDown, Withdrawn


async def test_priority_order_then_fifo_when_saturated() -> None:
    scheduler = Scheduler(max_concurrent=1, queue_max=10)
    order: list[str] = []
    release = trio.Event()

    async def hold() -> None:
        async with scheduler.slot("a", "normal"):
            await release.wait()

    async def job(name: str, priority: str) -> None:
        async with scheduler.slot("a", priority):
            order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold)
        await trio.testing.wait_all_tasks_blocked()
        for name, priority in [("low1", "low"), ("normal1", "normal"), ("high1", "high"), ("normal2", "normal"), ("high2", "high")]:
            nursery.start_soon(job, name, priority)
            await trio.testing.wait_all_tasks_blocked()
        assert scheduler.queued == 5
        release.set()
    assert order == ["high1", "high2", "normal1", "normal2", "low1"]
    assert scheduler.in_flight == 0


async def test_full_queue_answers_overloaded() -> None:
    scheduler = Scheduler(max_concurrent=1, queue_max=1)
    release = trio.Event()

    async def hold(agent: str) -> None:
        async with scheduler.slot(agent, "normal"):
            await release.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold, "a")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(hold, "a")  # queued
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(Overloaded):
            async with scheduler.slot("a", "high"):
                pass
        release.set()


async def test_per_agent_limit_lets_other_agents_run() -> None:
    scheduler = Scheduler(max_concurrent=4, per_agent=1, queue_max=10)
    release = trio.Event()
    started: list[str] = []

    async def job(agent: str) -> None:
        async with scheduler.slot(agent, "normal"):
            started.append(agent)
            await release.wait()

    async with trio.open_nursery() as nursery:
        for agent in ("a", "a", "b"):
            nursery.start_soon(job, agent)
            await trio.testing.wait_all_tasks_blocked()
        assert sorted(started) == ["a", "b"]
        assert scheduler.queued == 1
        release.set()
    assert sorted(started) == ["a", "a", "b"]


async def test_cancelled_waiter_leaves_the_queue() -> None:
    scheduler = Scheduler(max_concurrent=1, queue_max=10)
    release = trio.Event()

    async def hold() -> None:
        async with scheduler.slot("a", "normal"):
            await release.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold)
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(0.05) as scope:
            async with scheduler.slot("a", "normal"):
                pytest.fail("a cancelled waiter must not get a slot")
        assert scope.cancelled_caught
        assert scheduler.queued == 0
        release.set()
    assert scheduler.in_flight == 0


async def test_close_refuses_queued_and_new() -> None:
    scheduler = Scheduler(max_concurrent=1, queue_max=10)
    release = trio.Event()
    refused: list[str] = []

    async def hold() -> None:
        async with scheduler.slot("a", "normal"):
            await release.wait()

    async def waiter() -> None:
        try:
            async with scheduler.slot("a", "normal"):
                pytest.fail("a closed scheduler must not grant queued slots")
        except ShuttingDown:
            refused.append("queued")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        scheduler.close(ShuttingDown("bye"))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(ShuttingDown):
            async with scheduler.slot("b", "normal"):
                pass
        release.set()
    assert refused == ["queued"]


async def test_close_keeps_children_of_running_intents_queued_and_grants_them_slots() -> None:
    """A workflow step or agent call belongs to an intent the drain waits for: close refuses only new work."""
    scheduler = Scheduler(max_concurrent=1, queue_max=10)
    release = trio.Event()
    ran: list[str] = []
    refused: list[str] = []

    async def hold() -> None:
        async with scheduler.slot("a", "normal"):
            await release.wait()

    async def waiter(name: str, child: bool) -> None:
        try:
            async with scheduler.slot("a", "normal", child=child):
                ran.append(name)
        except ShuttingDown:
            refused.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "queued root", False)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "queued child", True)
        await trio.testing.wait_all_tasks_blocked()
        scheduler.close(ShuttingDown("bye"))
        await trio.testing.wait_all_tasks_blocked()
        assert refused == ["queued root"] and scheduler.queued == 1
        release.set()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, "new child", True)
        nursery.start_soon(waiter, "new root", False)
    assert ran == ["queued child", "new child"] and refused == ["queued root", "new root"]


async def test_withdraw_takes_a_queued_waiter_out_and_only_that_one() -> None:
    scheduler = Scheduler(max_concurrent=1, queue_max=10)
    release = trio.Event()
    outcomes: dict[str, str] = {}

    async def hold() -> None:
        async with scheduler.slot("a", "normal"):
            await release.wait()

    async def waiter(key: str) -> None:
        try:
            async with scheduler.slot("a", "normal", key=key):
                outcomes[key] = "ran"
        except Withdrawn as exc:
            outcomes[key] = exc.message

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold)
        await trio.testing.wait_all_tasks_blocked()
        for key in ("first", "second"):
            nursery.start_soon(waiter, key)
            await trio.testing.wait_all_tasks_blocked()
        assert scheduler.withdraw("first", Withdrawn("cancelled by its caller"))
        assert not scheduler.withdraw("first", Withdrawn("again")) and not scheduler.withdraw("unknown", Withdrawn("x"))
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == {"first": "cancelled by its caller"} and scheduler.queued == 1
        release.set()
    assert outcomes == {"first": "cancelled by its caller", "second": "ran"}
