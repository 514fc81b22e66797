"""The replica wire: JSON and event streams over a real unix socket; a failing handler answers 500."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import trio

from covenant.rune import wire


async def handler(request: wire.Request) -> wire.JSONResponse | wire.EventStream:
    if request.target == "/boom":
        raise KeyError("bug")
    if request.target == "/events":
        async def produce(emit: wire.Emit) -> None:
            for n in range(3):
                await emit("token", {"text": f"t{n}"})
            await emit("done", {"ok": True})
        return wire.EventStream(produce)
    return wire.JSONResponse(200, {"echo": request.body, "method": request.method})


async def test_json_events_and_a_failing_handler(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    sock = wire.bind_socket(path)
    assert path.stat().st_mode & 0o777 == 0o600
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(wire.serve, sock, handler, peer_pid=os.getpid, name="test"))
        status, document = await wire.call(path, "POST", "/x", {"a": "é"})
        assert (status, document) == (200, {"echo": {"a": "é"}, "method": "POST"})
        status, document = await wire.call(path, "POST", "/boom", {})
        assert status == 500 and document["error"]["code"] == "internal_error" and "KeyError" in document["error"]["message"]
        events: list[tuple[str, Any]] = [e async for e in wire.stream(path, "/events", {})]
        assert events == [("token", {"text": "t0"}), ("token", {"text": "t1"}), ("token", {"text": "t2"}), ("done", {"ok": True})]
        plain = [e async for e in wire.stream(path, "/x", {"b": 1})]
        assert plain == [("response", {"status": 200, "document": {"echo": {"b": 1}, "method": "POST"}})]
        status, _ = await wire.call(path, "GET", "/still-serving")
        assert status == 200
        nursery.cancel_scope.cancel()


async def test_an_unreachable_peer_is_a_wire_error(tmp_path: Path) -> None:
    try:
        await wire.call(tmp_path / "nobody.sock", "GET", "/")
    except wire.WireError as exc:
        assert "nobody.sock" in str(exc)
    else:
        raise AssertionError("no WireError")


def test_bind_refuses_to_replace_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("keep me")
    try:
        wire.bind_socket(target)
    except OSError as exc:
        assert "not a socket" in str(exc)
    else:
        raise AssertionError("replaced a regular file")
    assert target.read_text() == "keep me"


async def test_a_body_nested_past_the_recursion_limit_is_a_400_and_the_server_goes_on(tmp_path: Path) -> None:
    """The daemon's gateway serves a replica, an agent uid's process: its requests are hostile input."""
    path = tmp_path / "s.sock"
    sock = wire.bind_socket(path)
    body = b"[" * 50_000 + b"]" * 50_000
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(wire.serve, sock, handler, peer_pid=os.getpid, name="test"))
        stream = await trio.open_unix_socket(str(path))
        await stream.send_all(b"POST /x HTTP/1.1\r\nHost: replica\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(body) + body)
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
        await stream.aclose()
        assert answer.startswith(b"HTTP/1.1 400 ") and b"deeper than 64 levels" in answer, answer[:300]
        status, document = await wire.call(path, "POST", "/x", {"still": "serving"})
        assert status == 200 and document["echo"] == {"still": "serving"}
        nursery.cancel_scope.cancel()


async def test_a_burst_past_the_listen_backlog_waits_for_room_and_is_answered(tmp_path: Path) -> None:
    """On Linux a non-blocking connect to a unix socket whose listen backlog is full fails with EAGAIN; taken
    for a connect in progress, it left an unconnected socket whose peer read as pid 0 (the replica then took
    its own gateway for an impostor and exited) or whose first send failed."""
    import socket

    path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1)  # room for one waiting connection; the server starts accepting only after the burst
    answers: list[tuple[int, Any]] = []

    async def one(n: int) -> None:
        answers.append(await wire.call(path, "POST", "/x", {"n": n}, peer_pid=os.getpid()))

    async with trio.open_nursery() as server:
        async with trio.open_nursery() as clients:
            for n in range(20):
                clients.start_soon(one, n)
            await trio.sleep(0.3)  # every client has tried to connect by now
            await server.start(partial(wire.serve, sock, handler, peer_pid=os.getpid, name="test"))
        server.cancel_scope.cancel()
    assert sorted(document["echo"]["n"] for status, document in answers if status == 200) == list(range(20))


async def test_a_connection_from_another_process_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    """The gateway serves its replica only and the replica the daemon only; the agent's tools can reach both
    sockets. Another process gets a 403 and the connection closed: whether it sends a request, half of one,
    or nothing, the server neither waits for it nor reads it."""
    import socket

    path = tmp_path / "s.sock"
    sock = wire.bind_socket(path)
    serves: list[int | None] = [os.getpid() + 1]  # some other process
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(wire.serve, sock, handler, peer_pid=lambda: serves[0], name="test"))
        status, document = await wire.call(path, "POST", "/x", {"a": 1})
        assert status == 403 and document["error"]["code"] == "forbidden"

        def silent() -> bytes:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(str(path))
                s.sendall(b"POST /x HTTP/1.1\r\ncontent-length: 1000000\r\n\r\n")  # a body that never comes
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
                return answer

        with trio.fail_after(5):
            assert (await trio.to_thread.run_sync(silent)).startswith(b"HTTP/1.1 403")
        serves[0] = None  # a replica that is not running: nobody is served
        assert (await wire.call(path, "POST", "/x", {}))[0] == 403
        serves[0] = os.getpid()
        assert (await wire.call(path, "POST", "/x", {"a": 2})) == (200, {"echo": {"a": 2}, "method": "POST"})
        nursery.cancel_scope.cancel()
