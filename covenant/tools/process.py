"""``runtime: process`` tools (and ``runtime: wasm`` ones, whose program is the wasm runner): one JSON
document in, one out, through the runner's tool mode.

The module runs under ``[runtime] python3`` (``.py``), ``[runtime] node``
(``.js``) or as its own executable, with the agent's limits and the same
launch path, environment allowlist and kill ladder as agent processes
(:meth:`covenant.runtime.runner.Runner.run_tool`), its files confined to the
system's, its package folder (read-only) and its scratch dir; with the
``filesystem`` capability also the agent's workspace, read-write, as its
working directory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import trio

from covenant.runtime.tool_files import ToolFiles
from covenant.runtime.toolrun import ToolRun
from covenant.tools.catalogue import ToolEntry
from covenant.tools.context import ToolCallContext
from covenant.tools.result import ToolResult, capped
from covenant.tools.schema import first_error
from covenant.tools.services import ToolServices

__all__ = ["run_process_tool"]

log = logging.getLogger("covenant.tools")

_STDERR_HINT_CHARS = 300
"""How much of the tool's last stderr line a failure message shows the model."""


def _last_stderr_line(run: ToolRun) -> str:
    lines = [line for line in run.stderr_tail.splitlines() if line.strip()]
    if not lines:
        return ""
    return f"; its last stderr line: {lines[-1][-_STDERR_HINT_CHARS:]!r}"


def _result(entry: ToolEntry, run: ToolRun) -> ToolResult:
    name = entry.model_name
    match run.outcome:
        case "ok":
            if entry.output_validator is not None:
                error = first_error(entry.output_validator, run.result)
                if error is not None:
                    where = "/".join(str(p) for p in error.absolute_path) or "(the document)"
                    return ToolResult.failure(
                        "tool_bad_output", f"{name} answered a document that does not match its output schema at {where}: {error.message}"
                    )
            return capped(run.result)
        case "timeout":
            return ToolResult.failure("tool_timeout", f"{name} did not finish in time and was stopped")
        case "spawn_failed":
            return ToolResult.failure("tool_unavailable", f"{name} could not be started: {run.error}")
        case "protocol_error" | "no_result":
            return ToolResult.failure("tool_bad_output", f"{name} did not answer one JSON document: {run.error}")
        case "cancelled":
            return ToolResult.failure("tool_failed", f"{name} was stopped: covenant is shutting down")
        case _:
            return ToolResult.failure("tool_failed", f"{name} failed: {run.error}{_last_stderr_line(run)}")


async def run_process_tool(
    services: ToolServices, ctx: ToolCallContext, entry: ToolEntry, arguments: dict[str, Any], ends: float
) -> ToolResult:
    """One attempt of a process tool, given until ``ends`` (trio time); the caller holds one of the agent's
    run places for it (:func:`~covenant.tools.retry.run_with_retries`)."""
    document = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    package = str(ctx.agent.root)
    files = ToolFiles(read_only=(package, *entry.read_only))
    cwd = None
    if entry.declares_filesystem:
        workspace = str((await trio.to_thread.run_sync(services.workspace, ctx.agent.id)).root)
        files, cwd = ToolFiles(read_only=(package, *entry.read_only), read_write=(workspace,)), workspace
    wall_ms = max(1, int((ends - trio.current_time()) * 1000))
    # A tool that does not declare the network capability gets its own loopback and nothing else.
    network = services.config.tools.tool_network if entry.declares_network else "off"
    run = await services.runner.run_tool(
        ctx.agent, entry.argv, document, run_id=ctx.run_marker(), wall_ms=wall_ms, network=network, cwd=cwd, files=files,
        priority=ctx.priority,
    )
    log.info(
        "tool run",
        extra={
            "agent": ctx.agent.id,
            "intent": ctx.intent_id,
            "tool": entry.entry,
            "outcome": run.outcome,
            "pid": run.pid,
            "duration_ms": run.duration_ms,
            "cpu_ms": run.cpu_ms,
            "left_behind": run.left_behind,
            "detail": run.error,
        },
    )
    return dataclasses.replace(_result(entry, run), left_behind=run.left_behind)
