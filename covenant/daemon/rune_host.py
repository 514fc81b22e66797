"""The daemon's Rune side in one place: replicas, and the model and tool layers behind their gateways.

:class:`RuneHost` is what :class:`~covenant.daemon.service.Daemon` holds for
Rune agents: the :class:`~covenant.daemon.replicas.ReplicaSupervisor`, the
gateway calls (model calls through :class:`covenant.models.ModelGateway`,
tool calls through :class:`covenant.tools.ToolHost`), ``dry-run`` plans, and
the key values ``safety_policy`` redacts (read from the daemon's own
environment, never passed on).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.clock import now_ms
from covenant.config import Config
from covenant.daemon.intent_context import IntentContext
from covenant.daemon.intent_models import GatewayModels, intent_budget
from covenant.daemon.replica_gateway import GatewayRefused
from covenant.daemon.test_attempts import TestAttempts
from covenant.daemon.replicas import ReplicaSupervisor
from covenant.manifest.model import AgentSpec
from covenant.models import AgentModels, ModelCall, ModelError, ModelGateway
from covenant.rune.safety import LineRedactor, ValueRedactor, redact
from covenant.runtime.runner import Runner
from covenant.tools import ToolCallContext, ToolHost
from covenant.tools.mcp import servers_named

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage
    from covenant.policy.grants import GrantSet

__all__ = ["RuneHost", "ModelAndToolCalls"]


class ModelAndToolCalls:
    """:class:`~covenant.daemon.replica_gateway.GatewayCalls` over the model gateway and the tool host."""

    def __init__(self, models: ModelGateway, tools: ToolHost, grants: Callable[[], GrantSet],
                 secrets: Callable[[], list[str]]) -> None:
        self.models = models
        self.tools = tools
        self._grants = grants
        self._secrets = secrets
        self.attempts = TestAttempts(tools)

    async def model(
        self, intent: IntentContext, body: dict[str, Any], on_token: Callable[[str], Awaitable[None]] | None
    ) -> dict[str, Any]:
        messages, tools = body.get("messages"), body.get("tools") or []
        if not isinstance(messages, list) or not isinstance(tools, list):
            raise GatewayRefused("bad_request", "messages and tools must be lists", 400)
        alias = body.get("alias")
        if alias is not None and not isinstance(alias, str):
            raise GatewayRefused("bad_request", "alias must be a string or null", 400)
        budget = intent_budget(intent)
        adapter = body.get("adapter")
        if adapter is not None:  # the test-driven loop's: only an adapter id its intent's task lists
            adapter = self.attempts.adapter(intent, adapter)
        call = ModelCall(intent.intent_id, intent.agent.id, AgentModels.from_runefile(intent.package.runefile), budget,
                         alias=alias, adapter=adapter)
        # Whatever the model says, a key's value never reaches the replica (and so no session file).
        secrets = self._secrets()
        patterns = intent.package.runefile.models.safety_policy != "none"
        # A secret shape split across deltas shows only once its line is whole; a key value is an exact
        # string, so under `none` a delta goes on at once, less a tail that may begin a key value.
        redactor = LineRedactor(secrets) if patterns else ValueRedactor(secrets)

        async def redacted_token(text: str) -> None:
            assert on_token is not None
            if piece := redactor.feed(text):
                await on_token(piece)

        try:
            result = await self.models.chat(call, messages, tools, on_token=redacted_token if on_token else None)
        except ModelError as exc:
            raise GatewayRefused(exc.code, exc.message) from None
        if on_token is not None and (rest := redactor.flush()):
            await on_token(rest)
        return {
            "message": _redact_json(result.message, secrets, patterns),
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
            "provider": result.provider,
            "model": result.model,
        }

    async def tool(self, intent: IntentContext, body: dict[str, Any]) -> dict[str, Any]:
        name, arguments = body.get("name"), body.get("arguments")
        if not isinstance(name, str):
            name = ""
        if not isinstance(arguments, (str, dict)):
            arguments = ""
        context = ToolCallContext(
            intent_id=intent.intent_id,
            agent=intent.agent,
            issuer_pubkey=intent.issuer_pubkey,
            grants=self._grants(),
            now_ms=now_ms(),
            deadline=intent.deadline,
            models=GatewayModels(self.models, intent),
            priority=intent.priority,
            session_id=intent.session_id if intent.session_named else None,
        )
        result = await self.tools.call(context, name, arguments)
        if result.asks is not None:  # the replica may end the turn input_required only after such a call
            intent.asked_user = True
        document = result.to_json()
        patterns = intent.package.runefile.models.safety_policy != "none"
        return _redact_json(document, self._secrets(), patterns)


    async def attempt(self, intent: IntentContext, body: dict[str, Any]) -> dict[str, Any]:
        """One attempt of a ``loop: test-driven`` intent (:mod:`covenant.daemon.test_attempts`), redacted like a
        tool result: the code's output goes back to the model."""
        document = await self.attempts.attempt(intent, body)
        patterns = intent.package.runefile.models.safety_policy != "none"
        return _redact_json(document, self._secrets(), patterns)


def _redact_json(value: Any, secrets: list[str], patterns: bool) -> Any:
    """Every string inside ``value`` redacted (key values always; secret shapes with ``patterns``)."""
    if isinstance(value, str):
        return redact(value, secrets, patterns=patterns)
    if isinstance(value, list):
        return [_redact_json(v, secrets, patterns) for v in value]
    if isinstance(value, dict):
        return {k: _redact_json(v, secrets, patterns) for k, v in value.items()}
    return value


class RuneHost:
    """Replicas and their gateways for one daemon.

    ``packages`` is the daemon's current agent id -> Rune package map (set at start and on
    every reload); the tool host reads it too, so tools match what the registry validated.
    """

    def __init__(
        self, *, state_dir: Path, skills_dir: Path, config: Config, runner: Runner,
        models: ModelGateway, tools: ToolHost, grants: Callable[[], GrantSet], key: Ed25519PrivateKey,
    ) -> None:
        self.config = config
        self.models = models
        self.tools = tools
        self.packages: dict[str, RunePackage] = {}
        self.calls = ModelAndToolCalls(models, tools, grants, self.secret_values)
        self.replicas = ReplicaSupervisor(
            state_dir=state_dir, config=config, skills_dir=skills_dir, runner=runner, calls=self.calls,
            offered_tools=self._offered_tools, session_key=key, audit=tools.services.audit,
            on_stopped=self.tools.agent_stopped,
        )

    async def set_config(self, config: Config) -> list[str]:
        """Take a reloaded covenant.toml: model calls from now on use its ``[providers]`` (a call under way ends
        with the providers it began with), tool calls its tool settings. A running replica whose tools change
        (its toolset names an ``[mcp.NAME]`` whose table changed, or a built-in became available or not) is
        drained and started again in the background, so its model is offered the new toolset; returns those
        agents' ids."""
        running = [r for _, r in sorted(self.replicas.replicas.items()) if r.scope is not None]

        def offered() -> list[list[dict[str, Any]]]:  # resolving a toolset reads schema files: a worker thread
            return [self.tools.offered(r.agent) for r in running]

        before = await trio.to_thread.run_sync(offered)
        self.config = config
        self.models.reconfigure(config.providers)
        servers = self.tools.set_config(config)
        after = await trio.to_thread.run_sync(offered)
        refresh = [r.agent.id for r, old, new in zip(running, before, after)
                   if old != new or servers.intersection(servers_named(r.package))]
        self.replicas.restart_soon(refresh)
        return refresh

    def _offered_tools(self, agent: AgentSpec, package: RunePackage) -> list[dict[str, Any]]:
        """What a starting replica offers its model (in a worker thread): MCP servers connect first."""
        trio.from_thread.run(self.tools.prepare, agent)
        return self.tools.offered(agent)

    def secret_values(self) -> list[str]:
        """The provider keys' values (redacted from tool results and answers)."""
        names = {p.api_key_env for p in self.config.providers.values() if p.api_key_env}
        return [os.environ[n] for n in sorted(names) if os.environ.get(n)]

    def plan(self, agent: AgentSpec, package: RunePackage) -> dict[str, Any]:
        """What a dispatch would use: provider and model, and the tools not offered here."""
        return {
            "model": self.models.plan(AgentModels.from_runefile(package.runefile)).to_json(),
            "unavailable_tools": [{"tool": entry, "reason": reason} for entry, reason in self.tools.unavailable(agent)],
        }

    async def start_eager(self, packages: dict[str, RunePackage], agents: dict[str, AgentSpec]) -> None:
        if self.config.rune.start != "eager":
            return
        for agent_id, package in packages.items():
            self.replicas.ensure(agents[agent_id], package)
        await trio.lowlevel.checkpoint()
