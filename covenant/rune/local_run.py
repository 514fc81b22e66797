"""``covenant run`` of a Rune package: the replica's loop, in this process, once.

Same loop, limits and outcomes as under the daemon (``max_steps``,
``token_budget``, ``timeout_ms``, ``safety_policy``, the tool host's grants
check is skipped: there is no issuer but the operator running it). Providers
come from the home's covenant.toml and keys from this process's own
environment; the package's MCP servers are connected for the run, as a
replica's start connects them; nothing is written to the audit log (there is
no daemon) and the conversation is not kept (a one-shot session).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from covenant.clock import iso_now, now_ms
from covenant.config import Config
from covenant.home import Home
from covenant.manifest.model import AgentSpec
from covenant.manifest.runefile import RunePackage
from covenant.models import AgentModels, ModelCall, ModelError, ModelGateway, TokenBudget
from covenant.rune.conversation import Conversations, SessionPolicy, new_session_id
from covenant.rune.loop import LoopFailed, LoopSpec
from covenant.rune.safety import redact, still_secret
from covenant.rune.skills import with_skills
from covenant.rune.spec import loop_settings
from covenant.runtime.outcome import OUTCOMES, DispatchRecord
from covenant.runtime.runner import Runner
from covenant.tools import ToolCallContext, ToolHost

__all__ = ["run_package"]


class _LocalBackend:
    """Model calls straight to the gateway, tool calls straight to the tool host."""

    def __init__(self, models: ModelGateway, tools: ToolHost, agent: AgentSpec, package: RunePackage,
                 intent_id: str, issuer: str, grants: Any, secrets: list[str]) -> None:
        self.models, self.tools, self.agent, self.package = models, tools, agent, package
        self.intent_id, self.issuer, self.grants = intent_id, issuer, grants
        self.deadline = 0.0
        """The tool calls' deadline (trio clock): set when the loop starts."""
        self.secrets = secrets
        self.budget = TokenBudget(package.runefile.models.token_budget)

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                   on_token: Callable[[str], Awaitable[None]] | None) -> dict[str, Any]:
        call = ModelCall(self.intent_id, self.agent.id, AgentModels.from_runefile(self.package.runefile), self.budget)
        try:
            result = await self.models.chat(call, messages, tools, on_token=on_token)
        except ModelError as exc:
            raise LoopFailed(exc.code, exc.message) from None
        return {"message": result.message, "input_tokens": result.input_tokens, "output_tokens": result.output_tokens}

    async def tool(self, call_id: str, name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
        context = ToolCallContext(intent_id=self.intent_id, agent=self.agent, issuer_pubkey=self.issuer,
                                  grants=self.grants, now_ms=now_ms(), deadline=self.deadline)
        result = await self.tools.call(context, name, arguments)
        if not result.ok:
            return {"ok": False, "error_code": result.error_code, "error_message": result.error_message}
        content = result.content
        if self.package.runefile.models.safety_policy != "none" and isinstance(content, str):
            content = redact(content, self.secrets)
        return {"ok": True, "content": content}


async def _no_audit(event: str, data: dict[str, Any]) -> None:
    """``covenant run`` keeps no audit log."""


async def _answer(
    backend: _LocalBackend, text: str, *, home: Home, config: Config
) -> tuple[str, str | None, str | None, dict[str, Any] | None]:
    """(outcome, error, answer, usage) of one run of the package's loop, within its ``timeout_ms``."""
    agent, package, rf = backend.agent, backend.package, backend.package.runefile
    skills_path = home.root / config.rune.skills_dir  # an absolute skills_dir replaces the home part
    outcome, error, answer, usage = "ok", None, None, None
    if rf.loop == "test-driven":  # its attempts run as the agent and are recorded by the daemon alone
        return "spawn_failed", "loop: test-driven runs only under the daemon (covenant dispatch), not covenant run", None, None
    try:
        settings = await trio.to_thread.run_sync(
            lambda: loop_settings(package, skills_dir=skills_path, offered_tools=backend.tools.offered(agent),
                                  standard_turns=config.rune.standard_turns,
                                  skill_prompt_kb=config.rune.skill_prompt_kb))
    except Exception as exc:  # SkillError, unreadable schema files
        return "spawn_failed", str(exc), None, None
    spec = LoopSpec(settings["system_prompt"], settings["tools"], rf.max_steps, rf.models.safety_policy)
    backend.deadline = trio.current_time() + rf.timeout_ms / 1000
    conversations = Conversations(SessionPolicy(checkpoint_policy="never"))
    with trio.move_on_after(rf.timeout_ms / 1000) as timer:
        try:
            _, result = await conversations.answer(spec, with_skills(backend, settings["skills"]), text=text,
                                                   issuer=backend.issuer, session_id=None)
            answer, usage = result.text, result.usage
        except LoopFailed as exc:
            outcome, error, usage = exc.code if exc.code in OUTCOMES else "protocol_error", exc.message, exc.usage
    if timer.cancelled_caught:
        outcome, error = "timeout", f"no answer within the agent's timeout_ms = {rf.timeout_ms}"
    return outcome, error, answer, usage


async def run_package(
    agent: AgentSpec, package: RunePackage, text: str, *, home: Home, config: Config, runner: Runner,
    issuer: str, grants: Any, warn: Callable[[str], None] = lambda message: None,
) -> DispatchRecord:
    """Run ``text`` through the package's loop once; every fault is an outcome of the record.

    ``warn`` hears of each toolset entry the model is not offered (no daemon logs it here), and why.
    """
    rf = package.runefile
    intent_id = new_session_id()
    started_at, t0 = iso_now(), time.monotonic()
    secrets = [os.environ[p.api_key_env] for p in config.providers.values()
               if p.api_key_env and os.environ.get(p.api_key_env)]
    models = ModelGateway(config.providers, environ=os.environ, audit=_no_audit, store_text=False,
                          is_agent_uid=runner.isolation.is_agent_uid)
    tools = ToolHost(home, config, runner, _no_audit, packages=lambda a: package if a.id == agent.id else None)
    async with trio.open_nursery() as mcp_sessions:
        await mcp_sessions.start(tools.mcp.run)
        # As a replica's start does: the package's MCP servers first (each first attempt awaited, at most
        # FIRST_CONNECT_WAIT_S), so the model is offered their tools; a server that is down is left out.
        await tools.prepare(agent)
        for entry, reason in await trio.to_thread.run_sync(tools.unavailable, agent):
            warn(f"toolset entry {entry} is not offered to the model: {reason}")
        try:
            outcome, error, answer, usage = await _answer(
                _LocalBackend(models, tools, agent, package, intent_id, issuer, grants, secrets),
                text, home=home, config=config)
        finally:
            await tools.intent_ended(intent_id)  # its rune@process-* processes end with the run
            with trio.CancelScope(shield=True):
                await tools.mcp.stop(agent.id)  # stdio servers are killed
                await models.aclose()
            mcp_sessions.cancel_scope.cancel()
    if answer is not None and rf.models.safety_policy != "none":
        answer = redact(answer, secrets)
        if rf.models.safety_policy == "strict" and still_secret(answer, secrets):
            outcome, error, answer = "unsafe_output", "the answer still matched a secret pattern after redaction", None
    return DispatchRecord(
        intent_id=intent_id, agent_id=agent.id, agent_version=agent.version, runtime="rune", argv=[],
        limits={"timeout_ms": rf.timeout_ms, "max_steps": rf.max_steps, "token_budget": rf.models.token_budget},
        pid=os.getpid(), started_at=started_at, ended_at=iso_now(), exit_code=None, signal=None,
        outcome=outcome,  # type: ignore[arg-type]
        error=error, duration_ms=int((time.monotonic() - t0) * 1000), cpu_ms=0, peak_rss_kib=0, stdout_bytes=0,
        scratch_peak_bytes=0, stderr_tail="",
        result={"intent_id": intent_id, "status": "ok", "text": answer, "sources": []} if answer is not None else None,
        network_enforced=False, session_id=None,
        usage={k: v for k, v in usage.items() if type(v) is int} if usage else None,
    )
