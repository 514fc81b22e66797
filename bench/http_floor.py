"""What HTTP over the control socket costs by itself: covenant's servers vs a bare trio handler.

Serves a trivial app (read the request, answer 12 bytes of JSON) three ways on a
unix socket, each in its own process, and times sequential requests from this
process over a raw socket (a fixed request, read to EOF):

1. ``covenant.daemon.server.serve`` -- the control socket's h11 server, as the
   daemon runs it -- with a new connection per request (what ``covenant dispatch``
   does) and on one kept-alive connection;
2. ``covenant.daemon.network_server.serve_network`` -- the same server behind the
   webhook and A2A listeners' connection caps (hypercorn served those, and the
   control socket, before: 0.556 ms per request on a new connection here);
3. a bare ``trio.serve_listeners`` handler that reads up to the end of the
   headers and writes a fixed response: the floor of trio plus the kernel.

The difference is what the HTTP layer alone adds to every dispatch, before any
of covenant's own work (docs/performance.md, "Where the daemon's time goes").

    .venv/bin/python bench/http_floor.py [--requests N]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

_BODY = b'{"ok":true}\n'
_REQUEST = (b"POST /v1/x HTTP/1.1\r\nHost: covenant\r\nContent-Type: application/json\r\n"
            b"Content-Length: 300\r\n%s\r\n" + b"x" * 300)


def serve(kind: str, path: Path) -> None:
    """Run one server until killed (in a child process)."""
    import trio

    from covenant.daemon import server

    async def app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"12")]})
        await send({"type": "http.response.body", "body": _BODY})

    async def bare(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\nconnection: close\r\n\r\n" + _BODY)
        await stream.aclose()

    async def main() -> None:
        sock = server.bind_unix_socket(path)
        if kind == "control":
            await server.serve(app, [sock])
        elif kind == "network":
            from covenant.daemon.network_server import serve_network
            from covenant.triggers.webhook_config import ListenerLimits

            await serve_network(app, [sock], name="bench", limits=ListenerLimits())
        else:
            await trio.serve_listeners(bare, [trio.SocketListener(trio.socket.from_stdlib_socket(sock))])

    trio.run(main)


def _read_response(sock: socket.socket, until_eof: bool) -> bytes:
    data = b""
    while True:
        chunk = sock.recv(65536)
        data += chunk
        if not chunk or (not until_eof and data.endswith(_BODY)):
            return data


def time_requests(path: Path, count: int, keep_alive: bool) -> list[float]:
    times = []
    sock = None
    for _ in range(count):
        start = time.perf_counter()
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
        sock.sendall(_REQUEST % (b"" if keep_alive else b"Connection: close\r\n"))
        answer = _read_response(sock, until_eof=not keep_alive)
        if not keep_alive or b"connection: close" in answer.lower():
            sock.close()
            sock = None
        times.append(time.perf_counter() - start)
        if not answer.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"bad answer: {answer[:200]!r}")
    if sock is not None:
        sock.close()
    return times


def wait_for_socket(path: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"server for {path} did not start")
        time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests per case")
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], Path(args.serve[1]))
        return 0
    cases = (("control", "new connection each", False), ("control", "one kept-alive connection", True),
             ("network", "new connection each", False), ("network", "one kept-alive connection", True),
             ("bare trio", "new connection each", False))
    results: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        servers = {}
        for kind in ("control", "network", "bare trio"):
            path = Path(tmp) / f"{kind.replace(' ', '-')}.sock"
            servers[kind] = (path, subprocess.Popen([sys.executable, __file__, "--serve", kind, str(path)]))
        try:
            for kind, (path, process) in servers.items():
                wait_for_socket(path, process)
            load = os.getloadavg()[0]
            print(f"{args.requests} sequential requests per case, load {load:.2f}")
            for kind, how, keep_alive in cases:
                path = servers[kind][0]
                time_requests(path, 50, keep_alive)  # warm-up
                times = sorted(time_requests(path, args.requests, keep_alive))
                results[(kind, how)] = statistics.median(times)
                print(f"{kind:<10} {how:<26} p50 {statistics.median(times) * 1000:.3f} ms  "
                      f"p90 {times[int(len(times) * 0.9)] * 1000:.3f} ms")
        finally:
            for _, process in servers.values():
                process.kill()
                process.wait()
    bare = results[("bare trio", "new connection each")]
    for kind in ("control", "network"):
        extra = results[(kind, "new connection each")] - bare
        print(f"{kind} adds {extra * 1000:.3f} ms per request over the bare handler (new connection each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
