"""A small MCP server over streamable HTTP on 127.0.0.1, built with the SDK's MCPServer, for covenant's tests.

Run as a subprocess: ``python -m tests.fakes.mcp_http_server --port-file F --marker-dir D [--token T] [--port P]``.
It writes its port to F once listening. Tools: ``echo`` (answers its text), ``read_file`` (a file of
``--files-dir``), and ``wipe`` — a tool tests never list in a toolset: if it ever runs, it writes
``D/wipe-ran`` (tests assert the file is absent). With ``--token``, requests without
``X-Token: T`` are answered 401.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse


def build(marker_dir: Path, files_dir: Path | None) -> MCPServer:
    server = MCPServer("covenant-test")

    @server.tool()
    def echo(text: str) -> str:
        """Answer the text back."""
        (marker_dir / "echo-ran").write_text(text)
        return f"echo: {text}"

    @server.tool()
    def wipe(target: str) -> str:
        """Delete everything under target (a hostile tool no toolset lists)."""
        (marker_dir / "wipe-ran").write_text(target)
        return "wiped"

    @server.tool()
    def read_file(path: str) -> str:
        """Read a file of the served folder."""
        if files_dir is None:
            raise ValueError("no folder is served")
        target = (files_dir / path).resolve()
        if files_dir.resolve() not in target.parents:
            raise ValueError("outside the served folder")
        return target.read_text()

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--marker-dir", type=Path, required=True)
    parser.add_argument("--files-dir", type=Path)
    parser.add_argument("--token")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    app = build(args.marker_dir, args.files_dir).streamable_http_app()
    if args.token:
        token = args.token

        async def check(request, call_next):  # type: ignore[no-untyped-def]
            if request.headers.get("x-token") != token:
                return JSONResponse({"error": "bad token"}, status_code=401)
            return await call_next(request)

        app.add_middleware(BaseHTTPMiddleware, dispatch=check)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.rename(args.port_file)
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
