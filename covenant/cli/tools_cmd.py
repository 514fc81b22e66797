"""``covenant tools list [AGENT] [--json]``: every tool of every (or one) Rune agent, available or not and why.

Reads the home's files like ``agents check`` (no daemon needed): the
agents folder, covenant.toml (its ``[rune] unavailable_tools`` too). MCP
entries (``server/tool``) are decided by the running daemon, which holds the
connections: when one answers, its ``/v1/status`` ``mcp_servers`` say
whether each server is up and advertises the tool; without one they are
listed as unavailable with that reason. Process tools are available only where
their files can be confined: the running daemon says whether it can
(``tool_files``); without one, this host is judged as a daemon run by this
user would be.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from covenant.cli._common import CliContext, echo, ask_daemon, fail, pass_cli, print_json, reports_errors, table_lines
from covenant.errors import ExitCode

if TYPE_CHECKING:
    from covenant.tools.catalogue import McpLookup

__all__ = ["tools"]

_NO_DAEMON = "an MCP tool: its server is reached by the running daemon, and no daemon answered"


def _mcp_lookup(servers: list[dict[str, Any]], agent_id: str) -> "McpLookup":
    """(server, tool) -> an advertised-tool stand-in or the reason, from the daemon's ``mcp_servers``."""
    from covenant.tools.mcp import McpTool

    def lookup(server: str, tool: str) -> McpTool | str:
        found = next((s for s in servers if s["agent"] == agent_id and s["server"] == server), None)
        if found is None:
            return f"MCP server {server!r} is not connected (it connects when the agent's replica starts)"
        if found["state"] != "up":
            return f"MCP server {server!r} is {found['state']}: {found['last_error'] or 'first connection under way'}"
        if tool not in found["tools"]:
            return f"MCP server {server!r} does not advertise a tool {tool!r}"
        return McpTool(server, tool, "", {"type": "object"})

    return lookup


def _is_process_tool(package: Any, entry: str) -> bool:
    tool = package.tools.get(entry)
    return tool is not None and tool.runtime == "process"


def tool_rows(home: Any, agent: str | None) -> tuple[list[dict[str, Any]], bool]:
    """One row per toolset entry of each valid Rune agent (or of ``agent``); and whether a daemon answered."""
    from covenant.agent_names import resolve_agent_id
    from covenant.config import load_config
    from covenant.manifest.limits import ManifestLimits
    from covenant.manifest.registry import scan_agents
    from covenant.manifest.tools import MCP_SEPARATOR, tool_action
    from covenant.tools.catalogue import configured_toolset, model_name
    from covenant.tools.refuse import enforce_unavailable_policy

    config = load_config(home)
    registry = enforce_unavailable_policy(scan_agents(home.agents_dir, ManifestLimits.from_config(config.runtime)), config)
    packages = registry.rune_packages
    if agent is not None:
        agent_id = resolve_agent_id(agent, registry.agents)
        if agent_id not in packages:
            fail(f"{agent_id} is not a Rune agent: it has no tools (runtime {registry.agents[agent_id].runtime})",
                 ExitCode.NO_AGENT)
        packages = {agent_id: packages[agent_id]}
    status = ask_daemon(home, "/v1/status") if any(
        MCP_SEPARATOR in e or _is_process_tool(p, e) for p in packages.values() for e in p.runefile.toolset) else None
    servers = status.get("mcp_servers", []) if isinstance(status, dict) else None
    files = status.get("tool_files") if isinstance(status, dict) else None
    confinement = (lambda: files.get("problem")) if isinstance(files, dict) else None

    rows: list[dict[str, Any]] = []
    for agent_id in sorted(packages):
        package = packages[agent_id]
        lookup = _mcp_lookup(servers, agent_id) if servers is not None else (lambda s, t: _NO_DAEMON)
        toolset = configured_toolset(package, config, lookup, confinement)
        offered = {t.entry: t for t in toolset.available.values()}
        reasons = dict(toolset.unavailable)
        for entry in dict.fromkeys(package.runefile.toolset):
            tool = offered.get(entry)
            rows.append({
                "agent": agent_id,
                "entry": entry,
                "name": tool.model_name if tool else model_name(entry),
                "action": tool_action(entry),
                "kind": tool.kind if tool else ("mcp" if MCP_SEPARATOR in entry else "builtin" if entry.startswith("rune@") else "custom"),
                "available": tool is not None,
                "reason": None if tool else reasons.get(entry, "unavailable"),
            })
    return rows, status is not None


def builtin_rows(home: Any) -> list[dict[str, Any]]:
    """One row per built-in covenant knows, as this host and covenant.toml offer it to any agent, or why not."""
    from covenant.config import load_config
    from covenant.manifest.tools import BUILTIN_TOOLS, tool_action
    from covenant.tools.builtins import BUILTINS
    from covenant.tools.catalogue import model_name

    config = load_config(home)
    rows = []
    for entry in sorted(BUILTIN_TOOLS):
        builtin = BUILTINS[entry]
        reason = builtin.needs(config) if builtin.needs is not None else None
        rows.append({"entry": entry, "name": model_name(entry), "action": tool_action(entry),
                     "available": reason is None, "reason": reason})
    return rows


@click.group()
def tools() -> None:
    """List the tools of Rune agents."""


@tools.command("list")
@click.argument("agent", required=False)
@click.option("--builtins", is_flag=True,
              help="Every built-in covenant knows instead: offered on this host with this covenant.toml, or why not.")
@click.option("--json", "as_json", is_flag=True,
              help="Stable JSON: {daemon, tools: [{agent, entry, name, action, kind, available, reason}]}; with "
                   "--builtins {builtins: [{entry, name, action, available, reason}]}.")
@pass_cli
@reports_errors
def list_tools(cli: CliContext, agent: str | None, builtins: bool, as_json: bool) -> None:
    """Every tool of every Rune agent (or of AGENT): its model-facing name, capability, available or not and why.

    Reads the home's files (no daemon needed); MCP tools are asked of the
    running daemon when one answers (`daemon: true` in --json), else listed
    as unavailable. With --builtins, every built-in instead, as this host and
    covenant.toml offer it to any agent. Exit 0; 2 for AGENT with --builtins;
    6 when AGENT is not a valid Rune agent.
    """
    if builtins:
        if agent is not None:
            fail("--builtins lists what this host offers every agent: give no AGENT with it", ExitCode.USAGE)
        found = builtin_rows(cli.home)
        if as_json:
            print_json({"builtins": found})
            return
        for line in table_lines(("TOOL", "MODEL NAME", "CAPABILITY", "AVAILABLE"),
                                [(r["entry"], r["name"], r["action"], "yes" if r["available"] else f"no: {r['reason']}")
                                 for r in found]):
            echo(line)
        return
    rows, daemon = tool_rows(cli.home, agent)
    if as_json:
        print_json({"daemon": daemon, "tools": rows})
        return
    lines = table_lines(
        ("AGENT", "TOOL", "MODEL NAME", "CAPABILITY", "AVAILABLE"),
        [(r["agent"], r["entry"], r["name"], r["action"], "yes" if r["available"] else f"no: {r['reason']}") for r in rows],
    )
    for line in lines:
        echo(line)
    if not rows:
        echo("no Rune agent has tools")
