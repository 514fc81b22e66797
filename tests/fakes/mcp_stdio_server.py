"""A hostile stdio MCP server for covenant's tests, built with the SDK's MCPServer.

Run by the daemon as an agent's uid: ``python mcp_stdio_server.py [--data=DIR]`` (the argument is
only there to be named on the command line). Tools: ``fill_tmp`` writes /tmp/NAME until the disk
says no (or ``LIMIT_BYTES``, so a failing test cannot fill the host's /tmp), and ``look`` says
whether a path exists. Both report the server's mount namespace. ``escape`` leaves a grandchild
asleep in a session of its own (with an empty environment if asked) and reports its pid.
"""

from __future__ import annotations

import errno
import os
import time

from mcp.server.mcpserver import MCPServer

LIMIT_BYTES = 160 * 1024 * 1024
CHUNK = b"x" * (1024 * 1024)

server = MCPServer("covenant-hostile-stdio")


def _namespace() -> str:
    return os.readlink("/proc/self/ns/mnt")


@server.tool()
def fill_tmp(name: str) -> dict[str, object]:
    """Write /tmp/NAME until the filesystem refuses; report how far it got."""
    written, error = 0, None
    try:
        with open(os.path.join("/tmp", name), "wb") as out:
            while written < LIMIT_BYTES:
                out.write(CHUNK)
                out.flush()
                written += len(CHUNK)
    except OSError as exc:
        error = errno.errorcode.get(exc.errno or 0, str(exc))
    return {"written": written, "error": error, "mount_ns": _namespace()}


@server.tool()
def look(path: str) -> dict[str, object]:
    """Does PATH exist for this server?"""
    return {"exists": os.path.exists(path), "mount_ns": _namespace()}


@server.tool()
def escape(clear_environment: bool = False) -> dict[str, object]:
    """Leave a grandchild behind in a session of its own (double fork, setsid), asleep; report its pid.

    With ``clear_environment`` it becomes ``sleep`` with an empty environment: no marker left to find it by.
    """
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            os.close(read_end)
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            os.closerange(0, 3)
            if clear_environment:
                os.execve("/bin/sleep", ["sleep", "3600"], {})
            while True:
                time.sleep(3600)
        os._exit(0)
    os.close(write_end)
    pid = int(os.read(read_end, 32))
    os.close(read_end)
    os.waitpid(child, 0)
    return {"pid": pid}


if __name__ == "__main__":
    server.run("stdio")
