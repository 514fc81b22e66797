"""LogBroadcaster: recent events, live subscribers, slow readers, worker threads."""

from __future__ import annotations

import logging
import threading

import pytest
import trio
import trio.testing

from covenant.daemon.logstream import LogBroadcaster


@pytest.fixture
def broadcaster():
    """A broadcaster on its own logger, so tests never see each other's events."""
    b = LogBroadcaster(capacity=50, subscriber_buffer=8)
    logger = logging.getLogger("covenant.test.logstream")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(b)
    yield b, logger
    logger.removeHandler(b)
    b.close()


def test_recent_filters_by_agent_and_level(broadcaster) -> None:
    b, log = broadcaster
    log.debug("d", extra={"agent": "a"})
    log.info("i", extra={"agent": "a", "intent": "x1"})
    log.warning("w", extra={"agent": "b"})
    log.error("e")
    assert [e["msg"] for e in b.recent()] == ["d", "i", "w", "e"]
    assert [e["msg"] for e in b.recent(agent="a")] == ["d", "i"]
    assert [e["msg"] for e in b.recent(level="warning")] == ["w", "e"]
    assert [e["msg"] for e in b.recent(agent="a", level="info")] == ["i"]
    assert b.recent(agent="a")[1]["intent"] == "x1"
    assert [e["msg"] for e in b.recent(limit=2)] == ["w", "e"]
    seqs = [e["seq"] for e in b.recent()]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    with pytest.raises(ValueError, match="unknown log level"):
        b.recent(level="loud")


def test_ring_is_bounded(broadcaster) -> None:
    b, log = broadcaster
    for i in range(120):
        log.info("n%d", i)
    kept = b.recent()
    assert len(kept) == 50
    assert kept[0]["msg"] == "n70" and kept[-1]["msg"] == "n119"


async def test_subscriber_gets_backlog_then_new_events_in_order(broadcaster) -> None:
    b, log = broadcaster
    log.info("old-1", extra={"agent": "a"})
    log.info("old-2", extra={"agent": "b"})
    log.info("old-3", extra={"agent": "a"})
    got: list[str] = []
    with trio.fail_after(10):
        async with b.subscribe(agent="a", backlog=10) as events:
            log.info("new-1", extra={"agent": "a"})
            log.info("skip", extra={"agent": "b"})
            log.info("new-2", extra={"agent": "a"})
            async for event in events:
                got.append(event["msg"])
                if len(got) == 4:
                    break
    assert got == ["old-1", "old-3", "new-1", "new-2"]


async def test_level_filter_on_subscription(broadcaster) -> None:
    b, log = broadcaster
    with trio.fail_after(10):
        async with b.subscribe(level="warning") as events:
            log.info("quiet")
            log.error("loud")
            event = await events.__anext__()
    assert event["msg"] == "loud" and event["level"] == "error"


async def test_events_from_worker_threads_reach_subscribers(broadcaster) -> None:
    b, log = broadcaster
    received: list[str] = []

    def worker(n: int) -> None:
        for i in range(5):
            log.info("t%d-%d", n, i)

    with trio.fail_after(20):
        async with b.subscribe(buffer=100) as events:
            async with trio.open_nursery() as nursery:
                for n in range(4):
                    nursery.start_soon(trio.to_thread.run_sync, worker, n)
            # Also from a plain thread trio knows nothing about.
            t = threading.Thread(target=worker, args=(9,))
            t.start()
            await trio.to_thread.run_sync(t.join)
            async for event in events:
                received.append(event["msg"])
                if len(received) == 25:
                    break
    assert sorted(received) == sorted(f"t{n}-{i}" for n in (0, 1, 2, 3, 9) for i in range(5))
    # Per-thread order is kept (one FIFO hop onto the loop, scheduled under the lock).
    for n in (0, 1, 2, 3, 9):
        mine = [m for m in received if m.startswith(f"t{n}-")]
        assert mine == [f"t{n}-{i}" for i in range(5)]


async def test_slow_subscriber_never_blocks_and_gets_a_drop_marker(broadcaster) -> None:
    b, log = broadcaster
    async with b.subscribe() as slow, b.subscribe(buffer=1000) as fast:
        # 100 events while nobody reads: logging must return immediately every time.
        with trio.fail_after(5):
            for i in range(100):
                log.info("e%d", i)
            await trio.testing.wait_all_tasks_blocked()
        got = []
        with trio.fail_after(10):
            async for event in slow:
                got.append(event)
                if "dropped" in event:
                    break
        # The first 8 fit the buffer; the rest were counted, not queued.
        assert [e["msg"] for e in got[:8]] == [f"e{i}" for i in range(8)]
        marker = got[8]
        assert marker["dropped"] == 92 and marker["level"] == "warning"
        assert "dropped 92 lines" in marker["msg"]
        # Once it keeps up it receives new events again.
        log.info("after")
        with trio.fail_after(10):
            assert (await slow.__anext__())["msg"] == "after"
            fast_msgs = []
            async for event in fast:
                fast_msgs.append(event["msg"])
                if len(fast_msgs) == 101:
                    break
        assert fast_msgs == [f"e{i}" for i in range(100)] + ["after"]


async def test_marker_sits_where_the_gap_is(broadcaster) -> None:
    b, log = broadcaster
    async with b.subscribe(buffer=2) as sub:
        for i in range(5):
            log.info("a%d", i)
        await trio.testing.wait_all_tasks_blocked()
        first = await sub.__anext__()
        second = await sub.__anext__()
        log.info("late")
        await trio.testing.wait_all_tasks_blocked()
        rest = [await sub.__anext__(), await sub.__anext__()]
    assert [first["msg"], second["msg"]] == ["a0", "a1"]
    assert rest[0]["dropped"] == 3 and rest[1]["msg"] == "late"


async def test_close_ends_iteration_of_every_subscriber(broadcaster) -> None:
    b, log = broadcaster
    done = trio.Event()

    async def reader() -> None:
        async for _ in b.subscribe():
            pass
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        await trio.to_thread.run_sync(b.close)  # logging.shutdown runs off the loop
        with trio.fail_after(10):
            await done.wait()


async def test_closed_subscription_stops_receiving(broadcaster) -> None:
    b, log = broadcaster
    sub = b.subscribe()
    sub.close()
    log.info("after close")
    await trio.testing.wait_all_tasks_blocked()
    assert [e async for e in sub] == []


def test_handler_outlives_a_finished_trio_run(broadcaster) -> None:
    b, log = broadcaster

    async def subscribe_and_leave() -> None:
        b.subscribe()

    trio.run(subscribe_and_leave)
    log.info("after the run")  # must not raise RunFinishedError or hang
    assert b.recent()[-1]["msg"] == "after the run"


async def test_a_cancelled_read_loses_nothing(broadcaster) -> None:
    b, log = broadcaster
    async with b.subscribe() as sub:
        log.info("kept")
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            await sub.__anext__()
        assert scope.cancelled_caught
        assert (await sub.__anext__())["msg"] == "kept"
