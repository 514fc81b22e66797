"""What the daemon lends its tools: the home, the config, the runner, the audit sink, agents' memory and stores."""

from __future__ import annotations

from dataclasses import dataclass

from covenant.config import Config
from covenant.home import Home
from covenant.runtime.runner import Runner
from covenant.tools.context import AuditSink
from covenant.tools.agent_stores import AgentStores
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
    stores: AgentStores
    """knowledge, tasks and events (rune@knowledge-*, rune@task-*, rune@event-publish)."""
