"""Rune tool descriptors (``tools/*.yaml``) and the built-in ``rune@*`` tools.

Built-in tools need no descriptor: the package loader injects one for each
name in :data:`BUILTIN_TOOLS`. Every tool maps to one capability action in
the ``tool.`` namespace (:func:`tool_action`), which is what the policy
check sees.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, StrictStr, field_validator, model_validator

from covenant.actions import action_problem

__all__ = [
    "BUILTIN_TOOLS",
    "BUILTIN_PREFIX",
    "ToolDescriptor",
    "RetryPolicy",
    "RetryOn",
    "ToolRuntime",
    "tool_action",
    "builtin_descriptor",
    "NonEmptyStr",
    "PositiveInt",
    "AGENT_REF",
    "MCP_SEPARATOR",
    "McpServer",
    "UNSUPPORTED_RUNTIMES",
    "TOOL_CAPABILITIES",
    "builtin_actions",
    "mcp_tool_problem",
]

BUILTIN_PREFIX = "rune@"

BUILTIN_TOOLS: frozenset[str] = frozenset(
    BUILTIN_PREFIX + name
    for name in (
        "file-read file-write file-list apply-patch web-search web-fetch shell-exec system-time location-get "
        "memory-store memory-recall memory-list knowledge-add-entity knowledge-add-relation knowledge-query "
        "task-post task-claim task-complete task-list event-publish schedule-create schedule-list "
        "schedule-delete cron-create cron-list cron-cancel process-start process-poll process-write "
        "process-kill process-list image-analyze image-generate media-describe media-transcribe "
        "text-to-speech speech-to-text agent-send agent-list agent-find agent-spawn agent-kill a2a-discover "
        "a2a-send docker-exec browser-navigate browser-click browser-type browser-screenshot "
        "browser-read-page browser-close browser-scroll browser-wait browser-run-js browser-back "
        "channel-send canvas-present ask-user"
    ).split()
)
"""Every built-in tool of the Rune spec, by its ``rune@`` name, and covenant's own ``rune@ask-user``."""

AGENT_REF = re.compile(r"^(local://[a-z0-9]+(?:-[a-z0-9]+)*|https?://[^\s/]+\S*)$")
"""``local://agent-name`` or a full http(s) URL."""

ToolRuntime = Literal["wasm", "process", "container", "agent", "builtin"]

UNSUPPORTED_RUNTIMES: frozenset[str] = frozenset({"container"})
"""Spec runtimes this host has no backend for (``wasm`` runs through wasmtime: covenant.tools.wasm_backend). Their descriptors load (the package's other tools are
offered); each such tool is unavailable with the reason (:mod:`covenant.tools.catalogue`), never run."""

TOOL_CAPABILITIES: tuple[str, ...] = ("filesystem", "network")
"""The ``capabilities`` a tool descriptor may declare here (docs/tools.md, "Capabilities"): ``filesystem``
gives a process tool the agent's workspace, ``network`` the network. A tool declaring another one is
unavailable: covenant cannot grant what it does not know."""

MCP_SEPARATOR = "/"
"""A toolset entry ``server/tool`` names the tool ``tool`` of the MCP server ``server``."""

_MCP_PART = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_ENV_REF = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URL = re.compile(r"^https?://[^\s/?#]+[^\s]*$")


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


NonEmptyStr = Annotated[str, Strict(), AfterValidator(_not_blank)]
PositiveInt = Annotated[int, Strict(), Field(gt=0, le=24 * 3600 * 1000)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _server_name(value: str) -> str:
    if not _MCP_PART.match(value):
        raise ValueError(
            f"{value!r} must be 1-63 lowercase letters, digits, '_' or '-' (it becomes part of the "
            "capability action tool.mcp.<server>.<tool>)"
        )
    return value


def _http_url(value: str) -> str:
    if not _URL.match(value):
        raise ValueError(f"{value!r} must be an http:// or https:// URL (a streamable-HTTP MCP endpoint)")
    return value


def _headers(value: dict[str, str]) -> dict[str, str]:
    for name, header in value.items():
        if not _HEADER_NAME.match(name):
            raise ValueError(f"header name {name!r} is not a valid HTTP header name")
        if any(c in header for c in "\r\n\0"):
            raise ValueError(f"header {name!r}: the value must not contain CR, LF or NUL")
        for ref in _ENV_REF.findall(header):
            if not _ENV_NAME.match(ref):
                raise ValueError(
                    f"header {name!r}: ${{{ref}}} is not a variable reference (write ${{NAME}}, "
                    "letters, digits and '_')"
                )
    return value


class McpServer(_Model):
    """One ``mcp_servers`` entry: a streamable-HTTP MCP endpoint.

    ``${NAME}`` in header values is kept as written: it is resolved from the
    daemon's allowlisted environment when connecting, never at load.
    """

    name: Annotated[str, Strict(), AfterValidator(_server_name)]
    url: Annotated[str, Strict(), AfterValidator(_http_url)]
    headers: Annotated[dict[StrictStr, StrictStr], AfterValidator(_headers)] = {}


def mcp_tool_problem(entry: str) -> str | None:
    """Why a ``server/tool`` toolset entry is malformed, or None when it is well-formed."""
    server, _, tool = entry.partition(MCP_SEPARATOR)
    if not _MCP_PART.match(server) or not _MCP_PART.match(tool):
        return (
            f"MCP tool {entry!r} must be server/tool, each 1-63 lowercase letters, digits, '_' or '-' "
            "(it maps to the capability action tool.mcp.<server>.<tool>)"
        )
    return None
RetryOn = Literal["tool_failed", "tool_timeout", "tool_bad_output", "tool_unavailable"]
"""Tool error codes a retry may follow (docs/tools.md); refusals are never retried."""


class RetryPolicy(_Model):
    """How often a failed tool call is tried again: ``max_attempts`` in all, waiting ``backoff`` between.

    ``backoff``: ``exponential`` waits 200 ms before the second attempt and
    doubles each time (at most 5 s), ``fixed`` waits 200 ms each time,
    ``none`` not at all. ``on`` lists the error codes worth another attempt.
    No attempt starts past the intent's deadline.
    """

    max_attempts: Annotated[int, Strict(), Field(ge=1, le=100)] = 1
    backoff: Literal["exponential", "fixed", "none"] = "exponential"
    on: tuple[RetryOn, ...] = ("tool_failed", "tool_timeout")

    @model_validator(mode="before")
    @classmethod
    def _yaml_on_key(cls, data: Any) -> Any:
        """YAML 1.1 reads a bare ``on:`` key as the boolean true; within retry_policy it can only mean ``on``."""
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if key is True else key): value for key, value in data.items()}
        return data


class ToolDescriptor(_Model):
    """One callable tool: a custom ``tools/*.yaml`` file or an injected built-in."""

    name: NonEmptyStr
    version: NonEmptyStr = "0.1.0"
    runtime: ToolRuntime = "process"
    module: StrictStr = ""
    timeout_ms: PositiveInt = 5000
    retry_policy: RetryPolicy = RetryPolicy()
    capabilities: tuple[NonEmptyStr, ...] = ()
    input_schema_ref: StrictStr | None = None
    output_schema_ref: StrictStr | None = None
    agent_ref: StrictStr | None = None
    max_depth: Annotated[int, Strict(), Field(ge=1, le=100)] | None = None

    @field_validator("name")
    @classmethod
    def _custom_name(cls, name: str) -> str:
        if name.startswith(BUILTIN_PREFIX):
            raise ValueError(f"the {BUILTIN_PREFIX} prefix is reserved for built-in tools; rename the tool")
        problem = action_problem(f"tool.{name}")
        if problem is not None or "." in name or len(name) > 64:
            raise ValueError(
                f"{name!r} cannot name the action tool.{name}: use 1-64 lowercase letters, digits, '_' or '-'"
            )
        if f"tool.{name}" in builtin_actions():
            raise ValueError(
                f"{name!r} would need the capability action tool.{name}, which is the built-in "
                f"{_builtin_for_action(f'tool.{name}')}'s: a grant for one would grant the other; rename the tool"
            )
        if name == "mcp":
            raise ValueError("'mcp' is reserved: tool.mcp.* are the actions of MCP tools; rename the tool")
        return name

    @model_validator(mode="after")
    def _runtime_rules(self) -> "ToolDescriptor":
        if self.runtime == "builtin":
            raise ValueError(f"runtime 'builtin' is reserved for the {BUILTIN_PREFIX}* tools the runtime provides")
        if self.runtime == "agent" and not self.agent_ref:
            raise ValueError("runtime 'agent' requires agent_ref (local://agent-name or a URL)")
        if self.agent_ref is not None and not AGENT_REF.match(self.agent_ref):
            raise ValueError(f"agent_ref {self.agent_ref!r} must be local://agent-name or an http(s) URL")
        # Only a descriptor nothing could ever run is refused: a runtime without a backend here is judged
        # when the toolset is served (that one tool unavailable, with the reason). A container tool's
        # module (an image, or nothing: the reference runtime reads `runtime: container` alone) is the
        # container backend's to judge, not the loader's.
        if self.runtime in ("process", "wasm") and not self.module:
            raise ValueError(f"runtime {self.runtime!r} requires module (a path relative to the package folder)")
        return self


def builtin_descriptor(name: str) -> ToolDescriptor:
    """The descriptor injected for a built-in tool (bypasses the custom-name rules)."""
    return ToolDescriptor.model_construct(name=name, runtime="builtin")


_AUTHORITY_ACTIONS = {"rune@agent-spawn": "agent.spawn", "rune@agent-kill": "agent.spawn"}
"""Built-ins that are an authority rather than a tool: creating agents is ``agent.spawn``, whoever asks."""


def tool_action(name: str) -> str:
    """The capability action a tool needs.

    ``rune@web-fetch`` -> ``tool.web_fetch``; custom ``search_kb`` ->
    ``tool.search_kb``; MCP ``github/create_issue`` -> ``tool.mcp.github.create_issue``.
    """
    if name in _AUTHORITY_ACTIONS:
        return _AUTHORITY_ACTIONS[name]
    if name.startswith(BUILTIN_PREFIX):
        return "tool." + name[len(BUILTIN_PREFIX) :].replace("-", "_")
    if MCP_SEPARATOR in name:
        server, _, tool = name.partition(MCP_SEPARATOR)
        return f"tool.mcp.{server}.{tool}"
    return f"tool.{name}"


_BUILTIN_ACTIONS: dict[str, str] = {tool_action(name): name for name in BUILTIN_TOOLS}


def builtin_actions() -> frozenset[str]:
    """The capability actions of the built-in tools (``tool.web_fetch``, ...)."""
    return frozenset(_BUILTIN_ACTIONS)


def _builtin_for_action(action: str) -> str:
    return _BUILTIN_ACTIONS[action]
