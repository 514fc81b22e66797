"""The shape of a built-in tool: a name, a description, a JSON schema and an async function."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from covenant.config import Config
from covenant.tools.context import ToolCallContext

if TYPE_CHECKING:
    from covenant.tools.services import ToolServices

__all__ = ["Builtin", "BuiltinCall", "BuiltinRun", "NO_ARGUMENTS"]

NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
"""The schema of a tool that takes ``{}``."""


@dataclass(frozen=True)
class BuiltinCall:
    """What a built-in gets: the call's context, its validated arguments, the daemon-side services."""

    ctx: ToolCallContext
    arguments: dict[str, Any]
    services: "ToolServices"
    ends: float = math.inf
    """``trio.current_time()`` by which this attempt must end (its timeout_ms, the intent's deadline)."""
    memory_mb: int | None = None
    """The memory of the agent's ``resource_profile`` (``[rune] memory_*_mb``), for what the call runs outside the
    runner (a container); None when the host has no package for the agent."""


BuiltinRun = Callable[[BuiltinCall], Awaitable[Any]]
"""Returns the JSON-able result (or a :class:`~covenant.tools.result.ToolResult` already made of it, to say
more than its content: ``rune@shell-exec``'s ``left_behind``), or raises :class:`~covenant.tools.result.ToolError`."""


@dataclass(frozen=True)
class Builtin:
    """One ``rune@…`` tool the daemon runs itself."""

    name: str
    """The toolset name, ``rune@system-time``; models see it without the prefix."""
    description: str
    parameters: dict[str, Any]
    """JSON schema (draft 2020-12) of the arguments object."""
    run: BuiltinRun
    timeout_ms: "Callable[[Config, dict[str, Any]], int] | None" = None
    """The call's timeout from covenant.toml and its arguments, when the tool has its own
    (shell-exec, web-fetch); None: the toolset descriptor's ``timeout_ms`` (5000 by default)."""
    needs: Callable[[Config], str | None] | None = None
    """For a built-in that needs a backend configured: why it is unavailable under this config, or None."""
    runs_process: bool = False
    """Each call runs a process of the agent: it takes one of the agent's ``[tools] max_runs_per_agent`` places."""
