"""Kept-alive connections on the replica wire (the daemon's invokes, a replica's gateway calls): reuse, a server
gone while a connection was idle, a request never sent twice, the peer checked per request, nothing left open."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from covenant.rune import wire


class Server:
    """A wire server on ``path`` that counts the requests it handled; ``/vanish`` ends the server mid-request."""

    def __init__(self, path: Path, serves: list[int | None] | None = None) -> None:
        self.path = path
        self.serves = serves if serves is not None else [os.getpid()]
        self.handled: list[str] = []
        self.scope: trio.CancelScope | None = None

    async def handler(self, request: wire.Request) -> wire.JSONResponse | wire.EventStream:
        self.handled.append(request.target)
        if request.target == "/vanish":
            assert self.scope is not None
            self.scope.cancel()  # the process dies after reading the request, before answering
            await trio.sleep_forever()
        if request.target == "/events":
            async def produce(emit: wire.Emit) -> None:
                for n in range(3):
                    await emit("token", {"n": n})
                await emit("done", {})
            return wire.EventStream(produce)
        return wire.JSONResponse(200, {"echo": request.body})

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as self.scope:
            await wire.serve(wire.bind_socket(self.path), self.handler, peer_pid=lambda: self.serves[0], name="test",
                             task_status=task_status)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_one_connection_serves_many_requests_and_a_stream_read_to_its_end(tmp_path: Path) -> None:
    server = Server(tmp_path / "s.sock")
    pool = wire.ConnectionPool(server.path, os.getpid())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        for n in range(5):
            assert await wire.call(server.path, "POST", "/x", {"n": n}, pool=pool) == (200, {"echo": {"n": n}})
        events = [e async for e in wire.stream(server.path, "/events", {}, pool=pool)]
        assert [name for name, _ in events] == ["token", "token", "token", "done"]
        assert pool.opened == 1 and pool.idle_count() == 1
        # A stream left half-read is not handed to the next request: that connection is closed.
        abandoned = wire.stream(server.path, "/events", {}, pool=pool)
        assert (await abandoned.__anext__())[0] == "token"
        await abandoned.aclose()
        assert pool.idle_count() == 0
        assert (await wire.call(server.path, "GET", "/x", pool=pool))[0] == 200
        assert pool.opened == 2
        nursery.cancel_scope.cancel()
    pool.close()


async def test_a_server_gone_while_the_connection_was_idle_costs_the_next_call_nothing(tmp_path: Path) -> None:
    """The replica killed (or restarted) between two dispatches: its kept connection is found closed before
    anything is sent, and the call goes on a new connection to whoever serves the socket now."""
    path = tmp_path / "s.sock"
    pool = wire.ConnectionPool(path, os.getpid())
    for life in range(3):
        server = Server(path)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            assert await wire.call(path, "POST", "/x", {"life": life}, pool=pool) == (200, {"echo": {"life": life}})
            assert server.handled == ["/x"]
            nursery.cancel_scope.cancel()
    assert pool.opened == 3
    pool.close()


async def test_a_request_whose_server_vanished_after_reading_it_is_an_error_and_never_sent_again(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    server = Server(path)
    pool = wire.ConnectionPool(path, os.getpid())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        await wire.call(path, "POST", "/x", {}, pool=pool)  # the connection the next request reuses
        with pytest.raises(wire.WireError, match="connection lost|without answering"):
            await wire.call(path, "POST", "/vanish", {}, pool=pool)
    # The server is gone; had the pool retried, a second server on the path would see the request.
    second = Server(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        assert (await wire.call(path, "GET", "/after", pool=pool))[0] == 200
        nursery.cancel_scope.cancel()
    assert server.handled == ["/x", "/vanish"] and second.handled == ["/after"]
    pool.close()


async def test_the_peer_is_checked_for_every_request_on_a_kept_connection(tmp_path: Path) -> None:
    """The server's side: a connection accepted from the process it served is refused once it serves another
    (a replica's next life); the client's side: a pool for another pid never sends on a socket it finds."""
    server = Server(tmp_path / "s.sock")
    pool = wire.ConnectionPool(server.path, os.getpid())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        assert (await wire.call(server.path, "POST", "/x", {"a": 1}, pool=pool))[0] == 200
        server.serves[0] = os.getpid() + 1
        status, document = await wire.call(server.path, "POST", "/x", {"a": 2}, pool=pool)
        assert status == 403 and document["error"]["code"] == "forbidden"
        assert pool.opened == 1 and pool.idle_count() == 0  # it was the kept connection, and it is closed now
        assert server.handled == ["/x"]  # the refused request never reached the handler
        server.serves[0] = os.getpid()
        other = wire.ConnectionPool(server.path, os.getpid() + 1)
        with pytest.raises(wire.NotThePeer):
            await wire.call(server.path, "POST", "/x", {"a": 3}, pool=other)
        assert other.idle_count() == 0 and server.handled == ["/x"]
        nursery.cancel_scope.cancel()
    pool.close()


async def test_nothing_stays_open_once_the_pool_and_the_server_are_closed(tmp_path: Path) -> None:
    fds = _open_fds()
    server = Server(tmp_path / "s.sock")
    pool = wire.ConnectionPool(server.path, os.getpid(), max_idle=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        answers: list[Any] = []

        async def one(n: int) -> None:
            answers.append(await wire.call(server.path, "POST", "/x", {"n": n}, pool=pool))

        async with trio.open_nursery() as burst:  # 20 at once: 20 connections, at most 4 of them kept
            for n in range(20):
                burst.start_soon(one, n)
        assert len(answers) == 20 and pool.idle_count() == 4
        pool.close()
        assert pool.idle_count() == 0
        # A call on a closed pool still works, on a connection closed once answered.
        assert (await wire.call(server.path, "GET", "/x", pool=pool))[0] == 200 and pool.idle_count() == 0
        nursery.cancel_scope.cancel()
    assert _open_fds() == fds
