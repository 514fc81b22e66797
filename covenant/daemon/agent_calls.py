"""Agent tools and ``rune@agent-*`` as the daemon serves them: child intents of the calling intent.

The tool host asks through :class:`~covenant.tools.agents.AgentCalls`; this
answers with :meth:`ChildIntents.dispatch <covenant.daemon.child_intents.ChildIntents.dispatch>`, so the daemon (never the caller)
decides the network rule, the depth and the root issuer's grants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from covenant.clock import iso_ms
from covenant.errors import CovenantError
from covenant.tools.context import ToolCallContext
from covenant.tools.result import ToolError
from covenant.workflow import ChainLink, ChildCall

if TYPE_CHECKING:
    from covenant.daemon.service import Daemon

__all__ = ["DaemonAgentCalls"]


class DaemonAgentCalls:
    """:class:`~covenant.tools.agents.AgentCalls` over one daemon."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def call_agent(
        self, ctx: ToolCallContext, agent_ref: str, text: str, *, max_depth: int | None, timeout_s: float
    ) -> dict[str, Any]:
        call = ChildCall(
            parent_id=ctx.intent_id, agent_ref=agent_ref, text=text, via="tool",
            max_depth=max_depth if max_depth is not None else self.daemon.config.rune.max_depth, timeout_s=timeout_s,
        )
        try:
            return await self.daemon.children.dispatch(call)
        except CovenantError as exc:
            raise ToolError("agent_refused", f"the call to {agent_ref} was refused ({exc.code}): {exc.message}") from None

    async def send_remote(
        self, ctx: ToolCallContext, url: str, text: str, *, context_id: str | None, timeout_s: float
    ) -> dict[str, Any]:
        try:
            return await self.daemon.remote.send(self._parent(ctx), url, text, via="tool", context_id=context_id,
                                                 timeout_s=timeout_s)
        except CovenantError as exc:
            raise ToolError("agent_refused", f"the call to {url} was refused ({exc.code}): {exc.message}") from None

    async def discover_remote(self, ctx: ToolCallContext, url: str, *, timeout_s: float) -> dict[str, Any]:
        try:
            return await self.daemon.remote.discover(self._parent(ctx), url, timeout_s=timeout_s)
        except CovenantError as exc:
            raise ToolError("agent_refused" if exc.code == "remote" else "agent_failed",
                            f"{url}: {exc.message}") from None

    async def spawn(self, ctx: ToolCallContext, manifest: str) -> dict[str, Any]:
        try:
            spawned = await self.daemon.agents.spawn(self._parent(ctx), manifest)
        except CovenantError as exc:
            raise ToolError("spawn_refused", exc.message) from None
        return {"agent_id": spawned.agent.id, "expires_at": iso_ms(spawned.expires_ms)}

    async def kill(self, ctx: ToolCallContext, agent_id: str) -> dict[str, Any]:
        try:
            spawned = await self.daemon.agents.kill(self._parent(ctx), agent_id)
        except CovenantError as exc:
            raise ToolError("spawn_refused", exc.message) from None
        return {"agent_id": spawned.agent.id, "killed": True}

    def _parent(self, ctx: ToolCallContext) -> ChainLink:
        link = self.daemon.chain.get(ctx.intent_id)
        if link is None:
            raise ToolError("agent_refused", f"intent {ctx.intent_id} is not running")
        return link

    def peers(self, ctx: ToolCallContext) -> list[dict[str, Any]]:
        loaded = self.daemon.agents.loaded
        caller = loaded.packages.get(ctx.agent.id)
        if caller is None:
            return []
        mine = set(caller.runefile.networks)
        link = self.daemon.chain.get(ctx.intent_id)
        issuer = link.issuer.pubkey if link is not None else None
        out = []
        for agent_id, package in sorted(loaded.packages.items()):
            spawned = self.daemon.agents.spawned.live.get(agent_id)
            if spawned is not None and (spawned.spawner != ctx.agent.id or spawned.issuer != issuer):
                continue  # another agent's or another issuer's spawned helper: not this one's to see
            shared = mine & set(package.runefile.networks)
            if shared:
                out.append({
                    "agent": agent_id,
                    "name": package.runefile.name,
                    "description": " ".join(package.runefile.instructions.split())[:300],
                    "networks": sorted(shared),
                })
        return out
