"""``rune@docker-exec``: ``/bin/sh -c COMMAND`` in a fresh container of a listed image, as the agent.

The reference runtime's shape (``{command, image?, container_id?}``, answering ``exit_code``, ``stdout``,
``stderr``, ``container_id``). Each call gets a container of its own, removed when the command ends:
``container_id`` (a running container to exec into) is refused, since covenant keeps no container
between calls and never enters one it did not start. ``image`` defaults to the first of
``[tools.container] images``; an unlisted one is refused, never pulled. The container runs as in
:mod:`covenant.tools.containers`, its network ``[tools.container] network`` (default none).
"""

from __future__ import annotations

import math
from typing import Any

import trio

from covenant.config import Config
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.containers import container_problem, run_in_container
from covenant.tools.result import ToolError

__all__ = ["TOOL"]

_COMMAND_MAX_CHARS = 64 * 1024


def _timeout_ms(config: Config, arguments: dict[str, Any]) -> int:
    # The container is removed at the command's own timeout; the host's deadline comes after that, so the
    # model is told why.
    return config.tools.container.timeout_ms + 5000


def _cut(data: bytes, limit: int, keep_end: bool) -> tuple[str, bool]:
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), False
    return (data[-limit:] if keep_end else data[:limit]).decode("utf-8", "replace"), True


async def _run(call: BuiltinCall) -> dict[str, Any]:
    settings = call.services.config.tools.container
    if call.arguments.get("container_id"):
        raise ToolError("invalid_arguments", "container_id is not supported here: each command runs in a fresh "
                                             "container of a listed image, removed when it ends (give image instead)")
    image = call.arguments.get("image") or settings.images[0]
    left_ms = (call.ends - trio.current_time()) * 1000 if math.isfinite(call.ends) else math.inf
    wall_ms = min(settings.timeout_ms, left_ms)
    if wall_ms <= 0:
        raise ToolError("tool_timeout", "the intent has no time left to run the command")
    limit = settings.output_max_bytes
    run = await run_in_container(
        call.services, call.ctx, image, b"", ends=trio.current_time() + wall_ms / 1000, network=settings.network,
        command=("/bin/sh", "-c", call.arguments["command"]), output_max_bytes=limit, memory_mb=call.memory_mb,
    )
    match run.outcome:
        case "timeout":
            raise ToolError("tool_timeout", f"the command did not finish within {int(wall_ms)} ms; its container was removed")
        case "podman_error" | "spawn_failed":
            raise ToolError("tool_unavailable", f"the container of {image} could not be run: {run.last_stderr_line}")
    stdout, stdout_cut = _cut(run.stdout, limit, keep_end=False)
    stderr, stderr_cut = _cut(run.stderr_tail.encode("utf-8", "replace"), limit, keep_end=True)
    return {
        "exit_code": run.exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "stdout_truncated": stdout_cut or run.outcome == "output_too_large",
        "stderr_truncated": stderr_cut,
        "image": image,
        "container_id": run.name,
        "duration_ms": run.duration_ms,
    }


TOOL = Builtin(
    name="rune@docker-exec",
    description=(
        "Run a shell command (/bin/sh -c) in a fresh container of an image the operator allows, as your own "
        "unprivileged user, with no capabilities, a read-only root and a small /tmp; the container is removed "
        "afterwards. Returns exit_code, stdout and stderr (cut to a few KiB; the result says so)."
    ),
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1, "maxLength": _COMMAND_MAX_CHARS,
                        "description": "the command line, run by /bin/sh -c"},
            "image": {"type": "string", "minLength": 1, "maxLength": 255,
                      "description": "one of the allowed images (default: the first)"},
            "container_id": {"type": "string", "description": "not supported here: every command gets a fresh container"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    run=_run,
    timeout_ms=_timeout_ms,
    needs=container_problem,
    runs_process=True,
)
