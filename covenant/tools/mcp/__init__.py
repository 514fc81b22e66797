"""MCP servers as allowlisted tools (docs/tools.md, "MCP").

- :mod:`.endpoints` which server a ``server/tool`` entry reaches: ``[mcp.NAME]`` (stdio) or the
  Runefile's ``mcp_servers`` (streamable HTTP, ``${VAR}`` headers from ``[rune] mcp_header_env``)
- :mod:`.stdio` a stdio server started through the runner's launcher as the agent's uid
- :mod:`.hub` one supervised client session per (agent, server), retried with backoff
"""

from covenant.tools.mcp.endpoints import HttpEndpoint, StdioEndpoint, McpUnavailable, endpoint_for
from covenant.tools.mcp.hub import McpHub, McpTool, servers_named

__all__ = ["HttpEndpoint", "StdioEndpoint", "McpUnavailable", "endpoint_for", "McpHub", "McpTool", "servers_named"]
