"""Rune packages: a folder with a ``Runefile``, optional ``tools/*.yaml`` and ``workflow.yaml``.

:func:`load_rune_package` reads and validates every file of the package and
reports every problem at once (io / parse / validation, as the Rune spec's
error kinds). A valid package becomes an :class:`AgentSpec` with
``runtime="rune"`` via :meth:`RunePackage.to_agent_spec`; the package object
itself is kept by the registry for the hosted Rune runtime and the workflow
engine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, StrictBool, StrictStr

from covenant.manifest._yamlio import problem_at, read_yaml, validate_model
from covenant.manifest.limits import DEFAULT_LIMITS, ManifestLimits
from covenant.manifest.model import MAX_CPU_MS, AgentSpec, Capabilities, Resources
from covenant.manifest.problems import ManifestError, Problem
from covenant.manifest.tools import (
    BUILTIN_PREFIX,
    BUILTIN_TOOLS,
    MCP_SEPARATOR,
    McpServer,
    NonEmptyStr,
    PositiveInt,
    ToolDescriptor,
    builtin_descriptor,
    mcp_tool_problem,
    tool_action,
)
from covenant.manifest.workflow import WORKFLOW_FILE, Workflow, workflow_problems

__all__ = [
    "Runefile",
    "RuneRuntimeConfig",
    "HealthProbe",
    "ModelsConfig",
    "RunePackage",
    "load_rune_package",
    "RUNEFILE",
    "WORKFLOW_FILE",
    "TOOLS_DIR",
    "MIN_PROBE_INTERVAL_MS",
]

RUNEFILE = "Runefile"
TOOLS_DIR = "tools"

_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_SEMVER = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
_SKILL = re.compile(r"^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$")


def _agent_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{value!r} must be lowercase letters, digits and single hyphens (e.g. my-agent)")
    return value


def _semver(value: str) -> str:
    if not _SEMVER.match(value):
        raise ValueError(f"{value!r} is not a semver version (MAJOR.MINOR.PATCH, e.g. 0.1.0)")
    return value


def _skill(value: str) -> str:
    if not _SKILL.match(value):
        raise ValueError(f"{value!r} must be owner/repo/skill-name")
    return value


MIN_PROBE_INTERVAL_MS = 1000
"""The most often a replica is probed: four agents probed every millisecond took the daemon to 43 % of a core."""


def _probe_interval(value: int) -> int:
    if value < MIN_PROBE_INTERVAL_MS:
        raise ValueError(f"{value} is below the floor of {MIN_PROBE_INTERVAL_MS} ms (each probe is a request the "
                         f"daemon makes); use {MIN_PROBE_INTERVAL_MS} or more")
    return value


def _probe_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r} must be an HTTP path starting with '/'")
    return value


_Concurrency = Annotated[int, Strict(), Field(gt=0, le=10_000)]
_TokenBudget = Annotated[int, Strict(), Field(gt=0, le=10**9)]
_MaxSteps = Annotated[int, Strict(), Field(gt=0, le=1000)]
_TimeoutMs = Annotated[int, Strict(), Field(gt=0, le=MAX_CPU_MS)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HealthProbe(_Model):
    path: Annotated[str, Strict(), AfterValidator(_probe_path)] = "/health"
    interval_ms: Annotated[PositiveInt, AfterValidator(_probe_interval)] = 5000


class RuneRuntimeConfig(_Model):
    """The ``runtime:`` section: one replica's concurrency, health probe and timeouts."""

    concurrency_limit: _Concurrency = 10
    health_probe: HealthProbe = HealthProbe()
    startup_timeout_ms: PositiveInt = 10_000
    request_timeout_ms: PositiveInt = 30_000
    streaming_enabled: StrictBool = True
    checkpoint_policy: Literal["on_finish", "never", "each_step"] = "on_finish"
    resource_profile: Literal["small", "medium", "large"] = "small"


class ModelsConfig(_Model):
    """The ``models:`` section: providers, alias mapping, fallback, token budget, safety."""

    providers: tuple[NonEmptyStr, ...] = ()
    model_mapping: dict[StrictStr, NonEmptyStr] = {}
    fallback_policy: Literal["next_provider", "fail"] = "next_provider"
    token_budget: _TokenBudget = 100_000
    safety_policy: Literal["standard", "strict", "none"] = "standard"


class Runefile(_Model):
    """The package's agent: identity, prompt, toolset, limits, runtime and models."""

    name: Annotated[str, Strict(), AfterValidator(_agent_name)]
    version: Annotated[str, Strict(), AfterValidator(_semver)]
    instructions: NonEmptyStr
    default_model: NonEmptyStr
    toolset: tuple[NonEmptyStr, ...] = ()
    skills: tuple[Annotated[str, Strict(), AfterValidator(_skill)], ...] = ()
    memory_profile: Literal["minimal", "standard", "extended"] = "minimal"
    routing_hints: dict[StrictStr, Any] = {}
    max_steps: _MaxSteps = 20
    timeout_ms: _TimeoutMs = 30_000
    networks: tuple[NonEmptyStr, ...] = ("bridge",)
    runtime: RuneRuntimeConfig = RuneRuntimeConfig()
    models: ModelsConfig = ModelsConfig()
    mcp_servers: tuple[McpServer, ...] = ()
    """Streamable-HTTP MCP servers; ``server/tool`` toolset entries name their tools."""
    tools: tuple[ToolDescriptor, ...] = ()
    """Inline tool descriptors, exactly like files in ``tools/``."""
    loop: Literal["tools", "test-driven"] = "tools"
    """A covenant extension: ``tools`` is the Rune loop (model turns and tool calls); ``test-driven`` is the
    agent API's generate → execute → reflect → retry coding loop (docs/rune-packages.md)."""


@dataclass(frozen=True)
class RunePackage:
    """A validated Rune package; ``tools`` holds the custom descriptors and every built-in."""

    root: Path
    runefile_path: Path
    runefile: Runefile
    tools: dict[str, ToolDescriptor]
    workflow: Workflow | None
    workflow_path: Path | None
    files: tuple[Path, ...] = field(default=())
    """Every file the package was read from (Runefile, tools, workflow, tool modules)."""
    warnings: tuple[str, ...] = ()
    """Non-fatal remarks, e.g. an MCP server that must come from covenant.toml."""

    namespace: str = "local"
    """``local`` for a package in agents/; ``spawned`` for one an agent made with ``rune@agent-spawn``."""
    content_digest: str = ""
    """The digest of the package's files and of its skills' folders, set by the daemon's scan (empty
    elsewhere). Two versions whose Runefiles read the same still differ in it after, say, a SKILL.md
    edit, so a reload replaces the replica, whose instructions carry the skills."""

    @property
    def id(self) -> str:
        return f"{self.runefile.name}@{self.namespace}"

    def actions(self) -> tuple[str, ...]:
        """The capability actions the toolset requires, in toolset order, without repeats."""
        return tuple(dict.fromkeys(tool_action(name) for name in self.runefile.toolset))

    def keywords(self) -> tuple[str, ...]:
        return tuple(self.runefile.routing_hints.get("keywords", ()))

    def to_agent_spec(self) -> AgentSpec:
        """The normalized agent: runtime rune, no entry, timeout_ms as the per-task budget."""
        return AgentSpec(
            id=self.id,
            name=self.runefile.name,
            version=self.runefile.version,
            runtime="rune",
            kind="runefile",
            manifest_path=self.runefile_path,
            root=self.root,
            entry=None,
            capabilities=Capabilities(required=self.actions()),
            resources=Resources(cpu_ms_per_task=self.runefile.timeout_ms),
            resource_profile=self.runefile.runtime.resource_profile,
            keywords=self.keywords(),
            routing_hints=dict(self.runefile.routing_hints),
            warnings=self.warnings,
        )


def _runefile_rules(runefile: Runefile, tools: dict[str, ToolDescriptor]) -> list[tuple[tuple[str | int, ...], str]]:
    """Cross-field rules pydantic cannot see: toolset resolution, model alias, routing keywords."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    servers: dict[str, int] = {}
    for index, server in enumerate(runefile.mcp_servers):
        if server.name in servers:
            out.append(
                (
                    ("mcp_servers", index, "name"),
                    f"validation error: duplicate MCP server {server.name!r} (also mcp_servers[{servers[server.name]}])",
                )
            )
        servers.setdefault(server.name, index)
    for index, name in enumerate(runefile.toolset):
        if name.startswith(BUILTIN_PREFIX):
            if name not in BUILTIN_TOOLS:
                out.append((("toolset", index), f"validation error: unknown built-in tool {name!r}"))
        elif MCP_SEPARATOR in name:
            problem = mcp_tool_problem(name)
            if problem is not None:
                out.append((("toolset", index), f"validation error: {problem}"))
        elif name not in tools:
            out.append(
                (("toolset", index), f"validation error: tool {name!r} has no descriptor; add {TOOLS_DIR}/{name}.yaml")
            )
    if runefile.default_model not in runefile.models.model_mapping:
        known = ", ".join(runefile.models.model_mapping) or "none defined"
        out.append(
            (
                ("default_model",),
                f"validation error: {runefile.default_model!r} is not a key of models.model_mapping ({known})",
            )
        )
    keywords = runefile.routing_hints.get("keywords", [])
    if not isinstance(keywords, list) or not all(isinstance(k, str) and k.strip() for k in keywords):
        out.append(
            (("routing_hints", "keywords"), f"validation error: must be a list of non-empty strings, got {keywords!r}")
        )
    return out


def _mcp_warnings(runefile: Runefile) -> tuple[str, ...]:
    """MCP servers the toolset names but ``mcp_servers`` does not declare: they may come from covenant.toml."""
    declared = {server.name for server in runefile.mcp_servers}
    named = dict.fromkeys(n.partition(MCP_SEPARATOR)[0] for n in runefile.toolset if MCP_SEPARATOR in n)
    return tuple(
        f"toolset names MCP server {server!r}, which mcp_servers does not declare: its tools are unavailable "
        f"unless covenant.toml configures [mcp.{server}]"
        for server in named
        if server not in declared
    )


class _Tools:
    """The package's tools: every built-in, then custom descriptors from the Runefile and ``tools/``."""

    def __init__(self, root: Path, problems: list[Problem], files: list[Path], max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.real_root = os.path.realpath(root)
        self.problems = problems
        self.files = files
        self.tools: dict[str, ToolDescriptor] = {name: builtin_descriptor(name) for name in BUILTIN_TOOLS}
        self.origin: dict[str, str] = {}

    def add(self, tool: ToolDescriptor, path: Path, text: str, loc: tuple[str | int, ...], where: str) -> None:
        """Add one custom descriptor found at ``loc`` of ``path`` (described as ``where``)."""
        if tool.name in self.origin:
            self.problems.append(
                problem_at(path, text, (*loc, "name"), f"validation error: tool {tool.name!r} is also defined in {self.origin[tool.name]}")
            )
            return
        if tool.module and tool.runtime != "container":  # a container tool's module is an image reference
            module = Path(os.path.normpath(self.root / tool.module))
            real = os.path.realpath(module)
            if os.path.commonpath([self.real_root, real]) != self.real_root:
                self.problems.append(problem_at(path, text, (*loc, "module"), f"validation error: {tool.module!r} leaves the package folder"))
                return
            if not module.is_file():
                self.problems.append(problem_at(path, text, (*loc, "module"), f"validation error: {module} does not exist"))
                return
            self.files.append(module)
        self.origin[tool.name] = where
        self.tools[tool.name] = tool

    def add_folder(self) -> None:
        """Every ``tools/*.yaml`` descriptor, in name order."""
        tools_dir = self.root / TOOLS_DIR
        if not tools_dir.is_dir():
            return
        for path in sorted(tools_dir.glob("*.yaml")):
            self.files.append(path)
            loaded = read_yaml(path, self.problems, self.max_bytes)
            if loaded is None:
                continue
            text, data = loaded
            tool = validate_model(ToolDescriptor, data, path, text, self.problems)
            if tool is not None:
                self.add(tool, path, text, (), str(path))


def load_rune_package(folder: Path, limits: ManifestLimits = DEFAULT_LIMITS) -> RunePackage:
    """Read and validate a Rune package folder; raises ManifestError with every problem found.

    Every file is read under ``limits.max_bytes`` and the YAML bounds of
    :mod:`covenant.manifest.limits`.
    """
    root = Path(os.path.abspath(folder))
    problems: list[Problem] = []
    runefile_path = root / RUNEFILE
    files: list[Path] = [runefile_path]

    runefile: Runefile | None = None
    loaded = read_yaml(runefile_path, problems, limits.max_bytes)
    if loaded is not None:
        rf_text, data = loaded
        runefile = validate_model(Runefile, data, runefile_path, rf_text, problems)

    catalogue = _Tools(root, problems, files, limits.max_bytes)
    if runefile is not None:
        for index, tool in enumerate(runefile.tools):
            catalogue.add(tool, runefile_path, rf_text, ("tools", index), f"{runefile_path} tools[{index}]")
    catalogue.add_folder()
    tools = catalogue.tools

    workflow: Workflow | None = None
    workflow_path: Path | None = root / WORKFLOW_FILE
    if workflow_path is not None and workflow_path.exists():
        files.append(workflow_path)
        wf_loaded = read_yaml(workflow_path, problems, limits.max_bytes)
        if wf_loaded is not None:
            wf_text, wf_data = wf_loaded
            workflow = validate_model(Workflow, wf_data, workflow_path, wf_text, problems)
            if workflow is not None:
                problems.extend(problem_at(workflow_path, wf_text, loc, m) for loc, m in workflow_problems(workflow))
    else:
        workflow_path = None

    if runefile is not None:
        problems.extend(problem_at(runefile_path, rf_text, loc, m) for loc, m in _runefile_rules(runefile, tools))

    if problems or runefile is None:
        raise ManifestError(problems)
    return RunePackage(
        root=root,
        runefile_path=runefile_path,
        runefile=runefile,
        tools=tools,
        workflow=workflow,
        workflow_path=workflow_path,
        files=tuple(files),
        warnings=_mcp_warnings(runefile),
    )
