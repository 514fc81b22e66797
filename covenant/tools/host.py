"""The daemon-side tool host: every tool call of a Rune agent is decided, run and audited here.

The replica runs the model loop and asks the daemon to run each tool call;
the daemon hands the call to :meth:`ToolHost.call`, which, in order:

1. resolves the model-facing name to an available entry of the agent's
   toolset (else ``unknown_tool``; nothing runs);
2. parses the arguments (a JSON object; else ``invalid_arguments``) and, for a built-in, maps the
   reference runtime's argument names onto covenant's (:mod:`covenant.tools.reference_args`);
3. validates them against the tool's JSON schema (``invalid_arguments``);
4. checks the tool's capability action against the issuer's active grants
   (``capability_denied``);
5. runs the tool with its ``retry_policy`` and ``timeout_ms``, never past
   the intent's deadline, and caps the result's size;
6. records exactly one ``tool.call`` audit event (arguments as SHA-256 only, in covenant's names).

Every failure is an error result for the model, never an exception; only
the caller's cancellation (after the tool's processes are gone) and a
failing audit sink propagate.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from covenant.cancellation import only_cancelled
from covenant.config import Config
from covenant.home import Home
from covenant.manifest.model import AgentSpec
from covenant.runtime.artifacts import ArtifactRefused
from covenant.runtime.runner import Runner
from covenant.tools.agent_stores import AgentStores
from covenant.tools.agents import call_agent
from covenant.tools.audit import TOOL_CALL, args_sha256, tool_call_event
from covenant.tools.browsers import BrowserRegistry
from covenant.tools.builtins.base import BuiltinCall
from covenant.tools.capability import capability_refusal
from covenant.tools.catalogue import ToolEntry, Toolset, resolve_toolset
from covenant.tools.containers import run_container_tool
from covenant.tools.context import AuditSink, ToolCallContext
from covenant.tools.mcp import McpHub, McpUnavailable
from covenant.tools.mcp.call import mcp_result
from covenant.tools.memory_store import MemoryStores
from covenant.tools.packages import PackageFiles, PackageSource
from covenant.tools.process import run_process_tool
from covenant.tools.reference_args import Caller, ShapeError, canonical_arguments
from covenant import outside_json
from covenant.outside_json import MAX_DEPTH, nests_deeper
from covenant.tools.result import ToolError, ToolResult, capped
from covenant.tools.retry import run_with_retries
from covenant.tools.schema import first_error
from covenant.tools.schema_refs import SchemaCache, SchemaUrl, fetch_schema
from covenant.tools.services import ToolServices
from covenant.tools.supervised import ProcessRegistry

__all__ = ["ToolHost", "ToolObserver", "ARGUMENTS_MAX_BYTES"]

log = logging.getLogger("covenant.tools")

ToolObserver = Callable[[str, str, int], None]
"""``observe(agent, outcome, attempts)`` once per tool call (metrics): ``outcome`` is ``ok`` or the call's error code."""

ARGUMENTS_MAX_BYTES = 256 * 1024
"""Largest arguments document a call may carry."""

_AUDIT_ON_CANCEL_S = 5.0
_NAME_SHOWN = 80
"""How much of an unknown name the error message repeats to the model."""


@dataclass
class _CallState:
    """What the ``tool.call`` event of a call records, filled in as the call goes."""

    digest: str
    action: str | None = None
    attempts: int = 0
    left_behind: int = 0
    """Over all attempts."""
    aliases: tuple[str, ...] = ()
    """Argument names of the reference runtime that were mapped onto covenant's."""


class _BadArguments(Exception):
    pass


def _reject_constant(text: str) -> Any:
    raise ValueError(f"{text} is not valid JSON")


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_arguments(arguments: str | dict[str, Any]) -> dict[str, Any]:
    """The arguments object; a blank string is ``{}``. Raises _BadArguments with a reason."""
    if isinstance(arguments, dict):
        value: Any = arguments
    elif not isinstance(arguments, str):
        raise _BadArguments(f"arguments must be a JSON object, got {type(arguments).__name__}")
    elif len(arguments.encode("utf-8", "surrogatepass")) > ARGUMENTS_MAX_BYTES:
        raise _BadArguments(f"arguments are larger than {ARGUMENTS_MAX_BYTES} bytes")
    elif not arguments.strip():
        return {}
    else:
        try:
            value = outside_json.loads(arguments, surrogates="refuse", parse_constant=_reject_constant,
                                       object_pairs_hook=_reject_duplicates)
        except outside_json.LoneSurrogate:
            raise _BadArguments("arguments hold text that is not valid Unicode (a lone surrogate such as \\ud800)") from None
        except outside_json.TooDeep:
            raise _BadArguments(f"arguments nest deeper than {MAX_DEPTH} levels") from None
        except ValueError as exc:
            raise _BadArguments(f"arguments are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _BadArguments(f"arguments must be a JSON object, got {type(value).__name__}")
    if nests_deeper(value):
        raise _BadArguments(f"arguments nest deeper than {MAX_DEPTH} levels")
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _BadArguments("arguments hold text that is not valid Unicode (a lone surrogate such as \\ud800)") from None
    except (TypeError, ValueError) as exc:
        raise _BadArguments(f"arguments are not JSON: {exc}") from None
    return value


def _runs_process(entry: ToolEntry) -> bool:
    """Whether a call of ``entry`` runs a process of the agent (a process tool, ``rune@shell-exec``)."""
    if entry.builtin is not None:
        return entry.builtin.runs_process
    return entry.kind != "agent" and entry.mcp is None


def _schema_problem(entry: ToolEntry, arguments: dict[str, Any]) -> str | None:
    error = first_error(entry.validator, arguments)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(the arguments object)"
    return f"arguments do not match the schema of {entry.model_name} at {where}: {error.message}"


class ToolHost:
    """Offers each Rune agent its tools and runs the calls its model makes.

    One per daemon (or ``covenant run``). ``packages`` finds an agent's Rune
    package; the daemon passes its registry's, the default reads
    ``agent.root`` (:class:`~covenant.tools.packages.PackageFiles`).
    """

    def __init__(
        self,
        home: Home,
        config: Config,
        runner: Runner,
        audit: AuditSink,
        *,
        packages: PackageSource | None = None,
        observe: ToolObserver | None = None,
    ) -> None:
        self._observe = observe
        self.services = ToolServices(
            home=home, config=config, runner=runner, audit=audit, memory=MemoryStores(home),
            processes=ProcessRegistry(runner, config.tools.process, config.tools.shell.network), stores=AgentStores(home),
            browsers=BrowserRegistry(runner, config.tools.browser),
        )
        self._packages: PackageSource = packages or PackageFiles()
        self._toolsets: dict[str, tuple[object, int, Toolset]] = {}
        self._schema_cache = SchemaCache(home.state_dir / "schema-cache")
        self.mcp = McpHub(config, runner)
        """The agents' MCP sessions; run it (``nursery.start(host.mcp.run)``) to connect servers."""

    def set_config(self, config: Config) -> set[str]:
        """Take a reloaded covenant.toml (``[tools]``, ``[channels]``, ``[mcp]``, ``[a2a]`` remotes, schedules'
        names) for the tool calls that start from now on; every toolset is resolved again at its next use.
        Returns the ``[mcp.NAME]`` servers whose table changed (see :meth:`McpHub.set_config`)."""
        self.services.config = config
        self.services.processes.set_limits(config.tools.process, config.tools.shell.network)
        self.services.browsers.set_limits(config.tools.browser)
        self._toolsets.clear()
        return self.mcp.set_config(config)

    # -- what an agent is offered -----------------------------------------------------------

    def toolset(self, agent: AgentSpec) -> Toolset:
        """The agent's toolset as served here (cached per package object; resolved again after a reload).

        Resolving reads the package's schema files: the daemon calls
        :meth:`load` (or :meth:`call`, which resolves off the event loop).
        """
        package = self._packages(agent)
        if package is None:
            return Toolset()
        generation = self.mcp.generation(agent.id)
        cached = self._toolsets.get(agent.id)
        if cached is not None and cached[0] is package and cached[1] == generation:
            return cached[2]
        lookup = partial(self.mcp.lookup, agent.id) if self.mcp.running else None
        confinement = self.services.runner.tool_confinement
        toolset = resolve_toolset(package, self.services.runner.plans.interpreter, lookup, self.services.config,
                                  confinement=lambda: confinement.problem, schemas=self._fetch_schema)
        self._toolsets[agent.id] = (package, generation, toolset)
        return toolset

    def _profile_memory_mb(self, agent: AgentSpec) -> int | None:
        """The memory limit of the agent's ``resource_profile`` (what its replica gets), None for an agent without one."""
        found = self.services.runner.plans.resource_class(agent)
        return found.memory_mb if found is not None else None

    def _fetch_schema(self, ref: SchemaUrl) -> bytes:
        """A tool schema named by URL: fetched by the daemon under the web-fetch address rules, cached."""
        return fetch_schema(ref, self.services.config, self._schema_cache)

    async def load(self, agent: AgentSpec) -> Toolset:
        """:meth:`toolset`, resolved in a worker thread when it is not cached yet."""
        package = self._packages(agent)
        cached = self._toolsets.get(agent.id)
        if package is not None and cached is not None and cached[0] is package and cached[1] == self.mcp.generation(agent.id):
            return cached[2]
        return await trio.to_thread.run_sync(self.toolset, agent)

    async def prepare(self, agent: AgentSpec) -> None:
        """Connect the agent's MCP servers (first attempt awaited) before its replica is told its tools."""
        package = self._packages(agent)
        if package is not None:
            await self.mcp.prepare(agent, package)

    def offered(self, agent: AgentSpec) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` list: exactly the toolset's available entries, in toolset order."""
        return [entry.openai() for entry in self.toolset(agent).available.values()]

    def unavailable(self, agent: AgentSpec) -> list[tuple[str, str]]:
        """(toolset entry, reason) for each entry the model is not offered."""
        return list(self.toolset(agent).unavailable)

    async def intent_ended(self, intent_id: str) -> None:
        """Stop the supervised processes (``rune@process-*``) started for the intent, and its browser when it was
        kept for the intent (no session); call when it ends."""
        with trio.CancelScope(shield=True):
            await self.services.processes.intent_ended(intent_id)
            await self.services.browsers.intent_ended(intent_id)

    async def agent_stopped(self, agent_id: str) -> None:
        """The agent's replica stopped for good (stopped, reloaded, withdrawn, the daemon stopping): its MCP
        sessions and its browsers go with it."""
        with trio.CancelScope(shield=True):
            await self.mcp.stop(agent_id)
            await self.services.browsers.agent_stopped(agent_id)

    async def artifacts_of(self, intent_id: str) -> list[dict[str, Any]]:
        """The files the intent's tools handed back (its record's ``artifacts``); none when its index is
        unreadable (logged: the record is still written)."""
        store = self.services.artifacts
        assert store is not None
        try:
            if not store.may_have(intent_id):
                return []
            return await trio.to_thread.run_sync(store.list, intent_id)
        except (ArtifactRefused, OSError) as exc:
            log.warning("artifacts of intent %s not listed: %s", intent_id, exc, extra={"intent": intent_id})
            return []

    # -- one call -----------------------------------------------------------------------------

    async def call(self, ctx: ToolCallContext, name: str, arguments: str | dict[str, Any]) -> ToolResult:
        """Run one tool call of ``ctx.agent``'s model; always one ``tool.call`` event, never raises for the tool."""
        started = time.monotonic()
        state = _CallState(digest=args_sha256(arguments))
        try:
            result = await self._decide_and_run(ctx, name, arguments, state)
        except BaseException as exc:
            # Cancelled (possibly grouped by a nursery on the way out); anything else is a bug, still audited.
            code = "cancelled" if only_cancelled(exc) else "internal_error"
            self._observed(ctx, code, state)
            with trio.CancelScope(shield=True), trio.move_on_after(_AUDIT_ON_CANCEL_S):
                await self._audit(ctx, name, state, "error", code, started)
            raise
        self._observed(ctx, "ok" if result.ok else result.error_code or "error", state)
        await self._audit(ctx, name, state, result.outcome, result.error_code, started)
        return result

    def _observed(self, ctx: ToolCallContext, outcome: str, state: "_CallState") -> None:
        if self._observe is not None:
            self._observe(ctx.agent.id, outcome, state.attempts)

    async def _audit(
        self, ctx: ToolCallContext, name: str, state: "_CallState", outcome: str, code: str | None, started: float
    ) -> None:
        await self.services.audit(
            TOOL_CALL,
            tool_call_event(
                intent=ctx.intent_id,
                agent=ctx.agent.id,
                name=name if isinstance(name, str) else "",
                action=state.action,
                digest=state.digest,
                outcome=outcome,
                error_code=code,
                attempts=state.attempts,
                left_behind=state.left_behind,
                ms=int((time.monotonic() - started) * 1000),
                aliases=state.aliases,
            ),
        )

    async def _decide_and_run(
        self, ctx: ToolCallContext, name: str, arguments: str | dict[str, Any], state: "_CallState"
    ) -> ToolResult:
        toolset = await self.load(ctx.agent)
        entry = toolset.available.get(name) if isinstance(name, str) else None
        if entry is None:
            offered = ", ".join(toolset.available) or "none"
            shown = repr(name[:_NAME_SHOWN]) + ("…" if len(name) > _NAME_SHOWN else "") if isinstance(name, str) else "?"
            return ToolResult.failure("unknown_tool", f"no tool named {shown} is offered to this agent (offered: {offered})")
        state.action = entry.action
        try:
            parsed = parse_arguments(arguments)
        except _BadArguments as exc:
            return ToolResult.failure("invalid_arguments", str(exc))
        if entry.builtin is not None:
            try:
                mapped = canonical_arguments(entry.entry, parsed, Caller(ctx.agent.id))
            except ShapeError as exc:
                state.digest = args_sha256(parsed)
                return ToolResult.failure("invalid_arguments", str(exc))
            parsed, state.aliases = mapped.arguments, mapped.aliases
        state.digest = args_sha256(parsed)
        problem = _schema_problem(entry, parsed)
        if problem is not None:
            return ToolResult.failure("invalid_arguments", problem)
        refusal = capability_refusal(ctx, entry.action)
        if refusal is not None:
            return refusal

        async def attempt(ends: float) -> ToolResult:
            result = await self._attempt(ctx, entry, parsed, ends)
            state.left_behind += result.left_behind
            return result

        descriptor = entry.descriptor
        timeout_ms = descriptor.timeout_ms
        if entry.builtin is not None and entry.builtin.timeout_ms is not None and "timeout_ms" not in descriptor.model_fields_set:
            timeout_ms = entry.builtin.timeout_ms(self.services.config, parsed)
        result, state.attempts = await run_with_retries(
            attempt, policy=descriptor.retry_policy, timeout_ms=timeout_ms, deadline=ctx.deadline,
            place=partial(self.services.run_slot, ctx.agent.id) if _runs_process(entry) else None,
        )
        return result

    async def _attempt(self, ctx: ToolCallContext, entry: ToolEntry, arguments: dict[str, Any], ends: float) -> ToolResult:
        """One try of the tool, ending by ``ends`` (trio time)."""
        if entry.builtin is not None:
            return await self._run_builtin(ctx, entry, arguments, ends)
        if entry.kind == "agent":
            return await self._run_agent_tool(ctx, entry, arguments, ends)
        if entry.mcp is not None:
            return await self._run_mcp(ctx, entry, arguments, ends)
        if entry.kind == "container":
            return await run_container_tool(self.services, ctx, entry, arguments, ends, self._profile_memory_mb(ctx.agent))
        return await run_process_tool(self.services, ctx, entry, arguments, ends)

    async def _run_agent_tool(self, ctx: ToolCallContext, entry: ToolEntry, arguments: dict[str, Any], ends: float) -> ToolResult:
        """A ``runtime: agent`` tool: a child intent to ``agent_ref`` whose text is ``input``."""
        descriptor = entry.descriptor
        assert descriptor.agent_ref is not None
        try:
            content = await call_agent(
                self.services.agents, ctx, descriptor.agent_ref, arguments["input"], max_depth=descriptor.max_depth, ends=ends
            )
        except ToolError as exc:
            return ToolResult.failure(exc.code, exc.message)
        return capped(content)

    async def _run_mcp(self, ctx: ToolCallContext, entry: ToolEntry, arguments: dict[str, Any], ends: float) -> ToolResult:
        assert entry.mcp is not None
        timeout_s = max(0.001, ends - trio.current_time())
        try:
            answer = await self.mcp.call(ctx.agent.id, entry.mcp.server, entry.mcp.name, arguments, timeout_s)
        except McpUnavailable as exc:
            return ToolResult.failure("tool_unavailable", str(exc))
        except Exception as exc:  # the SDK's McpError, a broken connection: the server's fault, reported
            log.warning("MCP call failed", extra={"agent": ctx.agent.id, "intent": ctx.intent_id, "tool": entry.entry,
                                                  "detail": str(exc)[:300]})
            return ToolResult.failure("tool_failed", f"{entry.model_name} failed: {str(exc)[:300] or type(exc).__name__}")
        return mcp_result(entry.model_name, answer)

    async def _run_builtin(
        self, ctx: ToolCallContext, entry: ToolEntry, arguments: dict[str, Any], ends: float
    ) -> ToolResult:
        assert entry.builtin is not None
        try:
            content = await entry.builtin.run(BuiltinCall(ctx=ctx, arguments=arguments, services=self.services, ends=ends,
                                                          memory_mb=self._profile_memory_mb(ctx.agent)))
        except ToolError as exc:
            return ToolResult.failure(exc.code, exc.message)
        except Exception:
            log.exception("built-in tool failed", extra={"agent": ctx.agent.id, "intent": ctx.intent_id, "tool": entry.entry})
            return ToolResult.failure("tool_failed", f"{entry.model_name} failed inside covenant (see the daemon log)")
        return content if isinstance(content, ToolResult) else capped(content)
