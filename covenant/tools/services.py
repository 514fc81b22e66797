"""What the daemon lends its tools: the home, the config, the runner, the audit sink, agents' memory."""

from __future__ import annotations

from dataclasses import dataclass

from covenant.config import Config
from covenant.home import Home
from covenant.runtime.runner import Runner
from covenant.tools.agents import AgentCalls
from covenant.tools.context import AuditSink
from covenant.tools.memory_store import MemoryStores

__all__ = ["ToolServices"]


@dataclass
class ToolServices:
    """Shared by every built-in and process tool of one :class:`~covenant.tools.host.ToolHost`."""

    home: Home
    config: Config
    runner: Runner
    audit: AuditSink
    memory: MemoryStores
    agents: AgentCalls | None = None
    """Calls to other agents (agent tools, ``rune@agent-*``); the daemon sets it, ``covenant run`` has none."""
