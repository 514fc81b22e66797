"""What the daemon lends its tools: the home, the config, the runner, the audit sink, agents' memory and stores, workspaces and processes."""

from __future__ import annotations

from dataclasses import dataclass

from covenant.config import Config
from covenant.home import Home
from covenant.runtime.isolation import Isolation
from covenant.runtime.runner import Runner
from covenant.tools.agent_stores import AgentStores
from covenant.tools.agents import AgentCalls
from covenant.tools.context import AuditSink
from covenant.tools.memory_store import MemoryStores
from covenant.tools.supervised import ProcessRegistry
from covenant.tools.workspace import Workspace

__all__ = ["ToolServices"]


@dataclass
class ToolServices:
    """Shared by every built-in and process tool of one :class:`~covenant.tools.host.ToolHost`."""

    home: Home
    config: Config
    runner: Runner
    audit: AuditSink
    memory: MemoryStores
    processes: ProcessRegistry
    stores: AgentStores
    """knowledge, tasks and events (rune@knowledge-*, rune@task-*, rune@event-publish)."""
    agents: AgentCalls | None = None
    """Calls to other agents (agent tools, ``rune@agent-*``); the daemon sets it, ``covenant run`` has none."""

    def workspace(self, agent_id: str) -> Workspace:
        """The agent's workspace (made if missing, 0700, the agent's uid); blocking.

        A runner opened without a home (tests, ``covenant run``) has no state
        dir in its isolation: the home's is used, agents then being covenant's uid.
        """
        isolation = self.runner.isolation
        if isolation.state_dir is None:
            isolation = Isolation.same_uid("no isolation configured", self.home.state_dir)
        root = isolation.workspace_for(agent_id)
        return Workspace(root, isolation.credentials_for(agent_id), self.config.tools.files)
