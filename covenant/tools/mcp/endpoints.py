"""Where an MCP server named by a toolset is reached, resolved from covenant.toml and the Runefile.

``[mcp.NAME]`` in covenant.toml (a stdio server the operator configured)
takes precedence over a Runefile's ``mcp_servers`` entry of the same name
(a streamable-HTTP endpoint). ``${VAR}`` in a Runefile header is resolved
only from the daemon's variables listed in ``[rune] mcp_header_env``; the
daemon's other variables are never read for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from covenant.config import Config, McpServerConfig
from covenant.manifest.runefile import RunePackage

__all__ = ["HttpEndpoint", "StdioEndpoint", "McpUnavailable", "endpoint_for", "resolve_headers"]

_ENV_REF = re.compile(r"\$\{([^}]*)\}")


class McpUnavailable(Exception):
    """The server cannot be reached as configured; the message is the reason shown to operators."""


@dataclass(frozen=True)
class HttpEndpoint:
    url: str
    headers: tuple[tuple[str, str], ...]
    """Resolved values: secrets possibly; never logged, audited or shown."""

    def describe(self) -> str:
        return self.url


@dataclass(frozen=True)
class StdioEndpoint:
    config: McpServerConfig

    def describe(self) -> str:
        return "stdio: " + " ".join(self.config.command)


def resolve_headers(headers: Mapping[str, str], allowed: tuple[str, ...], environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Header values with every ``${VAR}`` replaced; McpUnavailable names the header and the variable."""
    out: list[tuple[str, str]] = []
    for name, template in headers.items():
        def value_of(match: re.Match[str], name: str = name) -> str:
            var = match.group(1)
            if var not in allowed:
                raise McpUnavailable(
                    f"header {name!r} names ${{{var}}}, which [rune] mcp_header_env does not list (covenant.toml)"
                )
            value = environ.get(var)
            if value is None or value == "":
                raise McpUnavailable(f"header {name!r} names ${{{var}}}, which is not set in the daemon's environment")
            if any(c in value for c in "\r\n\0"):
                raise McpUnavailable(f"header {name!r}: ${{{var}}} holds CR, LF or NUL")
            return value

        out.append((name, _ENV_REF.sub(value_of, template)))
    return tuple(out)


def endpoint_for(package: RunePackage, server: str, config: Config, environ: Mapping[str, str]) -> HttpEndpoint | StdioEndpoint:
    """The endpoint of ``server`` for this package; raises McpUnavailable with the reason."""
    configured = config.mcp.get(server)
    if configured is not None:
        return StdioEndpoint(configured)
    for declared in package.runefile.mcp_servers:
        if declared.name == server:
            return HttpEndpoint(declared.url, resolve_headers(declared.headers, config.rune.mcp_header_env, environ))
    raise McpUnavailable(f"MCP server {server!r} is neither in the Runefile's mcp_servers nor a [mcp.{server}] table in covenant.toml")
