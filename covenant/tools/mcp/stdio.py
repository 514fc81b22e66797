"""A stdio MCP server as a child of the agent's uid, spoken to by the SDK's ClientSession in the daemon.

The SDK's own ``stdio_client`` spawns with the daemon's uid and environment;
covenant starts the server through the runner's launcher instead (the
agent's uid and credentials, the agents' environment allowlist plus the
table's ``env``, ``RLIMIT_AS`` of the agent's ``resource_profile``,
``RLIMIT_NPROC``, its own process group, PDEATHSIG) and bridges its pipes to
the SDK's message streams: one JSON-RPC message per line each way.
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from covenant import outside_json
from covenant.config import Config, McpServerConfig
from covenant.manifest.model import AgentSpec
from covenant.runtime.environment import agent_environment
from covenant.runtime.launch_plans import resolve_program
from covenant.runtime.launcher import AgentCredentials, LaunchError, LaunchPlan
from covenant.runtime.pdeathsig import GATE_BYTE
from covenant.runtime.runner import Runner
from covenant.runtime.stderr_lines import StderrLines
from covenant.tools.mcp.sdk import load_sdk

__all__ = ["launched_stdio_server", "LINE_MAX_BYTES"]

log = logging.getLogger("covenant.tools")

LINE_MAX_BYTES = 4 * 1024 * 1024
"""A server line longer than this ends the connection (a runaway server cannot fill the daemon's memory)."""
_KILL_GRACE_S = 2.0
_MIB = 1024 * 1024


def _plan(config: Config, runner: Runner, agent: AgentSpec, server: McpServerConfig, memory_mb: int,
          scratch: str, creds: AgentCredentials | None) -> LaunchPlan:
    program = resolve_program(server.command[0], config.runtime.path)
    if program is None:
        raise LaunchError(f"program {server.command[0]!r} was not found on [runtime] path {config.runtime.path!r}")
    env = agent_environment(config.runtime, agent_id=agent.id, intent_id=f"mcp:{agent.id}", scratch=scratch,
                            parent_env=os.environ)
    env.update(server.env)
    env["MALLOC_ARENA_MAX"] = "2"  # glibc reserves 64 MiB of address space per arena; RLIMIT_AS counts it
    memory = memory_mb * _MIB
    rlimits = {resource.RLIMIT_AS: (memory, memory), resource.RLIMIT_CORE: (0, 0)}
    if creds is not None:
        nproc = runner.isolation.max_processes
        rlimits[resource.RLIMIT_NPROC] = (nproc, nproc)
    return LaunchPlan(
        argv=(program, *server.command[1:]),
        env=env,
        cwd=server.cwd or str(agent.root),
        rlimits=rlimits,
        pdeathsig=config.runtime.pdeathsig,
        credentials=creds,
    )


def _message(adapter: Any, line: bytes) -> Any:
    """One JSON-RPC message of a server's stdout. pydantic refuses a whole line that holds a lone surrogate
    (``\\ud800``), which would leave its call waiting for an answer that never comes: such a line is read
    with each lone surrogate replaced by U+FFFD instead (:mod:`covenant.outside_json`)."""
    try:
        return adapter.validate_json(line, by_name=False)
    except ValueError:
        if not outside_json.may_hold_surrogate(line):
            raise
        return adapter.validate_python(outside_json.loads(line), by_name=False)


@asynccontextmanager
async def launched_stdio_server(
    config: Config, runner: Runner, agent: AgentSpec, server_name: str, server: McpServerConfig, memory_mb: int
) -> AsyncIterator[tuple[object, object, trio.Event]]:
    """Start the server as the agent's uid; yield (read stream, write stream, exited) for ClientSession.

    On exit (or cancellation) the server's process group is killed and its uid released (swept when it
    was the uid's last live root).
    """
    await load_sdk()
    import anyio  # the SDK's streams; loaded with it
    import mcp_types
    from mcp.shared.message import SessionMessage

    creds = await runner.uids.claim(agent.id, resident=True)
    scratch = await trio.to_thread.run_sync(runner.scratch.make)
    try:
        if creds is not None:
            os.chown(scratch, creds.uid, creds.gid)
        plan = _plan(config, runner, agent, server, memory_mb, scratch, creds)
        launched = await runner.launch(plan, agent, server.network)  # a lasting thread: PDEATHSIG follows it
        exited = trio.Event()
        to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)

        async def wait_exit() -> None:
            await launched.wait_exit()
            exited.set()

        async def read_stdout() -> None:
            pending = b""
            async with to_session:
                while True:
                    chunk = await launched.stdout.receive_some(65536)
                    if not chunk:
                        return
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    if len(pending) > LINE_MAX_BYTES:
                        log.warning("MCP server line too long", extra={"agent": agent.id, "server": server_name})
                        return
                    for line in lines:
                        if not line.strip():
                            continue
                        try:
                            message = _message(mcp_types.jsonrpc_message_adapter, line)
                        except ValueError as exc:
                            await to_session.send(exc)
                            continue
                        await to_session.send(SessionMessage(message))

        async def write_stdin() -> None:
            async with from_session:
                async for item in from_session:
                    data = item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                    try:
                        await launched.stdin.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return

        async def drain_stderr() -> None:
            lines = StderrLines.within(config.runtime, "mcp server stderr", {"agent": agent.id, "server": server_name})
            while chunk := await launched.stderr.receive_some(65536):
                lines.feed(chunk)
                await trio.sleep(lines.pause_s())  # over its log budget: the server waits on a full pipe
            lines.flush()

        try:
            if launched.gated:
                await launched.stdin.send_all(GATE_BYTE)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_exit)
                nursery.start_soon(read_stdout)
                nursery.start_soon(write_stdin)
                nursery.start_soon(drain_stderr)
                try:
                    yield read_stream, write_stream, exited
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await launched.stop(_KILL_GRACE_S)
    finally:
        with trio.CancelScope(shield=True):
            await runner.uids.release(creds, agent.id, f"mcp:{agent.id}", resident=True)
            await runner.scratch.give_back(scratch)
