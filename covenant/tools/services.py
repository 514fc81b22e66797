"""What the daemon lends its tools: the home, the config, the runner, the audit sink, agents' memory and stores, workspaces,
processes and browsers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from covenant.config import Config
from covenant.home import Home
from covenant.runtime.artifacts import ArtifactLimits, ArtifactStore
from covenant.runtime.isolation import Isolation
from covenant.runtime.runner import Runner
from covenant.tools.agent_stores import AgentStores
from covenant.tools.agents import AgentCalls
from covenant.tools.browsers import BrowserRegistry
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
    browsers: BrowserRegistry
    """The agents' browsers (rune@browser-*)."""
    agents: AgentCalls | None = None
    """Calls to other agents (agent tools, ``rune@agent-*``); the daemon sets it, ``covenant run`` has none."""
    artifacts: ArtifactStore | None = None
    """Files the tools hand back, per intent (``state/artifacts/``); made from ``home`` when None."""
    _run_slots: dict[str, tuple[int, trio.Semaphore]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.artifacts is None:
            self.artifacts = ArtifactStore(self.home.state_dir / "artifacts")

    async def save_artifact(self, intent_id: str, name: str, media_type: str, data: bytes) -> dict[str, Any]:
        """Keep ``data`` as an artifact of the intent under ``[tools.artifacts]``'s caps; its index entry.

        Raises :class:`~covenant.runtime.artifacts.ArtifactRefused` (a bad name, a cap reached)."""
        caps = self.config.tools.artifacts
        limits = ArtifactLimits(max_files=caps.max_files, max_file_bytes=caps.max_file_kb * 1024,
                                max_intent_bytes=caps.max_intent_kb * 1024)
        assert self.artifacts is not None
        return await trio.to_thread.run_sync(self.artifacts.save, intent_id, name, media_type, data, limits)

    @asynccontextmanager
    async def run_slot(self, agent_id: str) -> AsyncIterator[None]:
        """Hold one of the agent's ``[tools] max_runs_per_agent`` places for a tool run; waits for one.

        A model turn may ask for hundreds of calls at once, and they are all
        run: without a bound each would be a process of the agent at the same
        time, failing on the uid's process limit and slowing every other
        agent's dispatches. A changed setting applies to the runs that start
        after the reload.
        """
        most = self.config.tools.max_runs_per_agent
        held = self._run_slots.get(agent_id)
        if held is None or held[0] != most:
            held = self._run_slots[agent_id] = (most, trio.Semaphore(most))
        async with held[1]:
            yield

    def forget_agent(self, agent_id: str) -> None:
        """An agent gone for good (a spawned one that ended): its memory and stores, loaded and on disk
        (blocking)."""
        self.memory.forget(agent_id)
        self.stores.forget(agent_id)

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
