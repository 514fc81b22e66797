"""One supervised MCP client session per (agent, server), in the daemon.

A connection is started when an agent's replica is about to start (its
toolset names ``server/tool`` entries) and stopped with the replica. Each
connection task: resolve the endpoint, connect (streamable HTTP with the
SDK's client, or a stdio server started as the agent's uid), ``initialize``,
list the server's tools, then ping every :data:`PING_INTERVAL_S`. Any
failure marks the server ``down`` with the reason and tries again after a
backoff (1 s doubling to 60 s). Only the toolset's ``server/tool`` entries
are ever looked up here: what a server advertises beyond them is never
offered and never callable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from covenant.config import Config
from covenant.manifest.model import AgentSpec
from covenant.manifest.runefile import RunePackage
from covenant.manifest.tools import MCP_SEPARATOR
from covenant.runtime.runner import Runner
from covenant.tools.mcp.endpoints import HttpEndpoint, McpUnavailable, StdioEndpoint, endpoint_for
from covenant.tools.mcp.sdk import load_sdk
from covenant.tools.mcp.stdio import launched_stdio_server

if TYPE_CHECKING:
    from mcp import ClientSession

__all__ = ["McpHub", "McpTool", "servers_named", "BACKOFF_FIRST_S", "BACKOFF_MAX_S", "PING_INTERVAL_S"]

log = logging.getLogger("covenant.tools")

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
PING_INTERVAL_S = 5.0
CONNECT_TIMEOUT_S = 20.0
"""initialize + tools/list must finish within this."""
FIRST_CONNECT_WAIT_S = 25.0
"""How long a replica start waits for its servers' first attempt before it starts without them."""
_LIST_PAGES_MAX = 20
_REASON_MAX = 300


@dataclass(frozen=True)
class McpTool:
    """One tool a server advertises (only ever used when the toolset lists it)."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]


def servers_named(package: RunePackage) -> list[str]:
    """The MCP servers the toolset names, in toolset order."""
    return list(dict.fromkeys(e.partition(MCP_SEPARATOR)[0] for e in package.runefile.toolset if MCP_SEPARATOR in e))


def _reason(exc: BaseException) -> str:
    """A one-line reason from an exception (the first leaf of a group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    import httpx2  # already loaded with the SDK when a connection failed

    if isinstance(exc, httpx2.ConnectError):
        text = f"cannot connect: {text}"
    elif isinstance(exc, trio.TooSlowError):
        text = f"no answer to initialize/tools/list within {CONNECT_TIMEOUT_S:g} s"
    return text.replace("\n", " ")[:_REASON_MAX]


@dataclass
class _Connection:
    agent: AgentSpec
    package: RunePackage
    server: str
    state: str = "connecting"
    """connecting | up | down"""
    endpoint: str = ""
    error: str | None = None
    attempts: int = 0
    tools: dict[str, McpTool] = field(default_factory=dict)
    session: ClientSession | None = None
    first_attempt: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    def view(self) -> dict[str, Any]:
        return {"agent": self.agent.id, "server": self.server, "endpoint": self.endpoint, "state": self.state,
                "tools": sorted(self.tools), "attempts": self.attempts, "last_error": self.error}


class McpHub:
    """The daemon's MCP client sessions; :meth:`run` must be running (in a nursery) for any to start."""

    def __init__(self, config: Config, runner: Runner, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.runner = runner
        self._environ = environ if environ is not None else os.environ
        self._nursery: trio.Nursery | None = None
        self._connections: dict[tuple[str, str], _Connection] = {}
        self._generation: dict[str, int] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    def set_config(self, config: Config) -> set[str]:
        """Take a reloaded covenant.toml; returns the ``[mcp.NAME]`` servers whose table was added, changed or
        removed. A connection reads the config when it (re)connects: the caller restarts the replicas of the
        agents whose toolset names one of them, which stops their connections and starts them afresh."""
        changed = {name for name in self.config.mcp.keys() | config.mcp.keys()
                   if self.config.mcp.get(name) != config.mcp.get(name)}
        self.config = config
        return changed

    @property
    def running(self) -> bool:
        return self._nursery is not None

    def generation(self, agent_id: str) -> int:
        """Changes whenever one of the agent's servers changes state or tools (the toolset cache key)."""
        return self._generation.get(agent_id, 0)

    def _changed(self, conn: _Connection) -> None:
        self._generation[conn.agent.id] = self._generation.get(conn.agent.id, 0) + 1

    # -- lifecycle ---------------------------------------------------------------------------------

    async def prepare(self, agent: AgentSpec, package: RunePackage) -> None:
        """Start the connections of the agent's MCP servers (replacing those of an older package) and wait
        (at most :data:`FIRST_CONNECT_WAIT_S`) for each one's first attempt."""
        if self._nursery is None:
            return
        waits: list[_Connection] = []
        for server in servers_named(package):
            key = (agent.id, server)
            conn = self._connections.get(key)
            if conn is not None and (conn.package is not package or conn.scope.cancel_called):
                await self._stop(conn)  # an older package's, or one being stopped: replaced
                conn = None
            if conn is None:
                conn = self._connections[key] = _Connection(agent, package, server)
                self._nursery.start_soon(self._supervise, conn)
            waits.append(conn)
        with trio.move_on_after(FIRST_CONNECT_WAIT_S):
            for conn in waits:
                await conn.first_attempt.wait()

    async def stop(self, agent_id: str) -> None:
        """Close the agent's sessions; stdio servers are killed and their uid released."""
        for key in [k for k in self._connections if k[0] == agent_id]:
            await self._stop(self._connections[key])

    async def _stop(self, conn: _Connection) -> None:
        conn.scope.cancel()
        with trio.CancelScope(shield=True):
            await conn.done.wait()
        if self._connections.get((conn.agent.id, conn.server)) is conn:
            del self._connections[(conn.agent.id, conn.server)]
        self._changed(conn)

    # -- what the tool host asks -------------------------------------------------------------------

    def lookup(self, agent_id: str, server: str, tool: str) -> McpTool | str:
        """The advertised tool, or why it cannot be offered now."""
        conn = self._connections.get((agent_id, server))
        if conn is None:
            if self._nursery is None:
                return "MCP servers are connected by the daemon (not running here)"
            return f"MCP server {server!r} is not connected (it connects when the agent's replica starts)"
        if conn.state != "up":
            return f"MCP server {server!r} is {conn.state}: {conn.error or 'first connection under way'}"
        found = conn.tools.get(tool)
        if found is None:
            return f"MCP server {server!r} does not advertise a tool {tool!r}"
        return found

    def status(self, agent_id: str | None = None) -> list[dict[str, Any]]:
        return [c.view() for k, c in sorted(self._connections.items()) if agent_id is None or k[0] == agent_id]

    async def call(self, agent_id: str, server: str, tool: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The tool's result; raises McpUnavailable (server not up) or the SDK's error."""
        conn = self._connections.get((agent_id, server))
        if conn is None or conn.state != "up" or conn.session is None:
            reason = conn.error if conn is not None and conn.error else "not connected"
            raise McpUnavailable(f"MCP server {server!r} is not available: {reason}")
        return await conn.session.call_tool(tool, arguments, read_timeout_seconds=timeout_s)

    # -- one connection ----------------------------------------------------------------------------

    async def _supervise(self, conn: _Connection) -> None:
        backoff = BACKOFF_FIRST_S
        try:
            with conn.scope:
                while True:
                    conn.attempts += 1
                    try:
                        await self._session_life(conn)
                        reason = "the server closed the connection"
                    except McpUnavailable as exc:
                        reason = str(exc)
                    except Exception as exc:  # the server's fault or the network's: reported, retried
                        reason = _reason(exc)
                    was_up = conn.state == "up"
                    conn.state, conn.error, conn.session, conn.tools = "down", reason, None, {}
                    self._changed(conn)
                    conn.first_attempt.set()
                    log.warning("MCP server down", extra={"agent": conn.agent.id, "server": conn.server,
                                                          "detail": reason, "retry_s": backoff})
                    if was_up:
                        backoff = BACKOFF_FIRST_S
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
        finally:
            conn.state, conn.session = "stopped", None
            conn.first_attempt.set()
            conn.done.set()

    async def _session_life(self, conn: _Connection) -> None:
        endpoint = endpoint_for(conn.package, conn.server, self.config, self._environ)
        conn.endpoint = endpoint.describe()
        await load_sdk()
        from mcp import ClientSession

        async with self._transport(conn, endpoint) as (read, write, exited):
            async with ClientSession(read, write) as session:
                with trio.fail_after(CONNECT_TIMEOUT_S):
                    await session.initialize()
                    tools = await self._list_tools(conn.server, session)
                conn.state, conn.error, conn.session, conn.tools = "up", None, session, tools
                self._changed(conn)
                conn.first_attempt.set()
                log.info("MCP server up", extra={"agent": conn.agent.id, "server": conn.server, "tools": len(tools)})
                while not exited.is_set():
                    with trio.move_on_after(PING_INTERVAL_S):
                        await exited.wait()
                    if exited.is_set():
                        break
                    with trio.fail_after(CONNECT_TIMEOUT_S):
                        await session.send_ping()
        raise McpUnavailable("the server process exited")

    @staticmethod
    async def _list_tools(server: str, session: ClientSession) -> dict[str, McpTool]:
        from mcp_types import PaginatedRequestParams

        tools: dict[str, McpTool] = {}
        cursor: str | None = None
        for _ in range(_LIST_PAGES_MAX):
            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            for tool in page.tools:
                schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
                tools[tool.name] = McpTool(server, tool.name, tool.description or "", dict(schema))
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    @asynccontextmanager
    async def _transport(self, conn: _Connection, endpoint: HttpEndpoint | StdioEndpoint) -> AsyncIterator[tuple[Any, Any, trio.Event]]:
        if isinstance(endpoint, StdioEndpoint):
            memory_mb = self.config.rune.memory_mb(conn.package.runefile.runtime.resource_profile)
            async with launched_stdio_server(self.config, self.runner, conn.agent, conn.server, endpoint.config,
                                             memory_mb) as streams:
                yield streams
            return
        from mcp.client.streamable_http import streamable_http_client

        never = trio.Event()
        import httpx2

        timeout = httpx2.Timeout(30.0, read=300.0)
        async with httpx2.AsyncClient(headers=dict(endpoint.headers), timeout=timeout, follow_redirects=False) as client:
            async with streamable_http_client(endpoint.url, http_client=client) as (read, write):
                yield read, write, never
