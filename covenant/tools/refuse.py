"""``[rune] unavailable_tools = "refuse"``: an agent whose toolset holds an entry this host cannot offer is rejected.

Applied to a scanned :class:`~covenant.manifest.registry.Registry` by the
daemon (start and reload) and by ``agents check``/``list``/``show``, so all
of them agree. MCP entries are not judged here: their servers are reached by
the running daemon, and a down server never stops an agent (design §8); nor are
tools whose schema is a URL, which the running daemon fetches.
"""

from __future__ import annotations

from covenant.config import Config
from covenant.manifest._yamlio import node_line
from covenant.manifest.problems import Problem
from covenant.manifest.registry import Registry
from covenant.manifest.tools import MCP_SEPARATOR
from covenant.tools.catalogue import configured_toolset, url_schema_refs

__all__ = ["enforce_unavailable_policy"]


def enforce_unavailable_policy(registry: Registry, config: Config) -> Registry:
    """With ``refuse``, move each Rune agent with an unavailable (non-MCP) entry to the problems; returns ``registry``."""
    if config.rune.unavailable_tools != "refuse":
        return registry
    for agent_id, package in list(registry.rune_packages.items()):
        toolset = configured_toolset(package, config)
        refused = [(entry, reason) for entry, reason in toolset.unavailable if MCP_SEPARATOR not in entry
                   and not (entry in package.tools and url_schema_refs(package.tools[entry]))]
        if not refused:
            continue
        spec = registry.agents.pop(agent_id)
        del registry.rune_packages[agent_id]
        path = spec.manifest_path
        registry.sources[path] = None
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        entries = list(package.runefile.toolset)
        for entry, reason in refused:
            index = entries.index(entry)
            line = node_line(text, ("toolset", index)) if text else None
            registry.problems.append(Problem(
                path, line, f"toolset[{index}]",
                f"tool {entry} is unavailable here ({reason}) and [rune] unavailable_tools = \"refuse\" "
                "(covenant.toml) makes that a load error",
            ))
    return registry
