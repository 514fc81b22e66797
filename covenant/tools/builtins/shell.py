"""``rune@shell-exec``: ``/bin/sh -c COMMAND`` as the agent, in its workspace, under its limits.

Runs through the runner's tool mode (:meth:`~covenant.runtime.runner.Runner.run_tool`):
the agent's uid, its memory and disk limits, RLIMIT_NPROC of its uid, its
``network`` setting, the agents' PATH and environment allowlist (never the
daemon's environment), its process group killed at the end. The working
directory is the agent's workspace; where the host confines tool files
(Landlock), the command sees the system's files read-only and writes only the
workspace and its scratch dir. The timeout is the call's ``timeout_ms``,
at most ``[tools.shell_exec] timeout_ms`` (its default) and never past the
intent's remaining time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import trio

from covenant.config import Config
from covenant.runtime.tool_files import ToolFiles
from covenant.runtime.toolrun import ToolRun
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.result import ToolError, ToolResult, capped

__all__ = ["TOOL", "SHELL", "command_timeout_ms"]

SHELL = "/bin/sh"
_COMMAND_MAX_CHARS = 64 * 1024


def command_timeout_ms(config: Config, arguments: dict[str, Any]) -> int:
    """The call's timeout: its ``timeout_ms``, at most the configured one (also the default)."""
    most = config.tools.shell_exec.timeout_ms
    return min(int(arguments.get("timeout_ms") or most), most)


def _call_timeout_ms(config: Config, arguments: dict[str, Any]) -> int:
    # The runner stops the command at its own timeout; the host's deadline comes after
    # the kill ladder, so the model is told the runner's reason rather than a bare timeout.
    return command_timeout_ms(config, arguments) + config.runtime.kill_grace_ms + 1000


def _cut(data: bytes, limit: int, keep_end: bool) -> tuple[str, bool]:
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), False
    part = data[-limit:] if keep_end else data[:limit]
    return part.decode("utf-8", "replace"), True


def _result(run: ToolRun, limit: int) -> dict[str, Any]:
    match run.outcome:
        case "timeout":
            raise ToolError("tool_timeout", f"the command did not finish in time and was killed: {run.error}")
        case "spawn_failed":
            raise ToolError("tool_unavailable", f"the command could not be started: {run.error}")
        case "cpu_exceeded" | "memory_exceeded" | "disk_exceeded" | "output_too_large" | "cancelled":
            raise ToolError("tool_failed", f"the command was stopped ({run.outcome}): {run.error}")
    stdout, stdout_cut = _cut(run.stdout, limit, keep_end=False)
    stderr, stderr_cut = _cut(run.stderr_tail.encode("utf-8", "replace"), limit, keep_end=True)
    return {
        "exit_code": run.exit_code,
        "signal": run.signal,
        "stdout": stdout,
        "stderr": stderr,
        "stdout_truncated": stdout_cut,
        "stderr_truncated": stderr_cut,
        "duration_ms": run.duration_ms,
        "left_behind": run.left_behind,
    }


async def _run(call: BuiltinCall) -> ToolResult:
    command = call.arguments["command"]
    config = call.services.config

    workspace = await trio.to_thread.run_sync(call.services.workspace, call.ctx.agent.id)
    left_ms = (call.ends - trio.current_time()) * 1000 if math.isfinite(call.ends) else math.inf
    wall_ms = int(min(command_timeout_ms(config, call.arguments), left_ms))
    if wall_ms <= 0:
        raise ToolError("tool_timeout", "the intent has no time left to run the command")
    root = str(workspace.root)
    files = call.services.runner.tool_confinement.where_possible(ToolFiles(read_write=(root,)))
    run = await call.services.runner.run_tool(
        call.ctx.agent, (SHELL, "-c", command), b"", run_id=call.ctx.run_marker(), wall_ms=wall_ms,
        network=config.tools.shell.network, cwd=root, files=files, priority=call.ctx.priority,
    )
    return dataclasses.replace(capped(_result(run, config.tools.shell_exec.output_max_bytes)), left_behind=run.left_behind)


TOOL = Builtin(
    name="rune@shell-exec",
    description=(
        "Run a shell command (/bin/sh -c) in your workspace, as your own unprivileged user, with your memory, process "
        "and time limits. Returns exit_code, stdout and stderr (cut to a few KiB; the result says so). No input on stdin."
    ),
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1, "maxLength": _COMMAND_MAX_CHARS, "description": "the command line"},
            "timeout_ms": {"type": "integer", "minimum": 1, "description": "stop it after this long (capped by the host)"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    run=_run,
    timeout_ms=_call_timeout_ms,
    runs_process=True,
)
