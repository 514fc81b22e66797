"""An agent's toolset resolved into the tools it is offered and the ones it is not.

Every toolset entry becomes either a :class:`ToolEntry` (offered to the
model under its model-facing name) or an ``(entry, reason)`` pair. Built-ins
are offered without their ``rune@`` prefix (``system-time``), custom tools as
named (design/rune-host.md §8). Pure apart from reading ``input_schema_ref``
and ``output_schema_ref`` files inside the package, and, for a schema named by URL, asking the
``schemas`` source (the daemon fetches: :mod:`covenant.tools.schema_refs`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from covenant.config import Config
from covenant.manifest._yamlio import safe_loader
from covenant.manifest.runefile import RunePackage
from covenant.manifest.security import is_inside, ownership_problems
from covenant.manifest.tools import BUILTIN_PREFIX, MCP_SEPARATOR, TOOL_CAPABILITIES, ToolDescriptor, tool_action
from covenant.tools.agents import AGENT_TOOL_SCHEMA
from covenant.tools.builtins import BUILTINS, Builtin
from covenant.tools.containers import image_problem
from covenant.tools.mcp.hub import McpTool
from covenant.tools.schema import schema_problem, validator_for
from covenant.tools.schema_refs import SchemaFetchError, SchemaUrl, parse_schema_url
from covenant.tools.wasm_backend import wasm_backend
from covenant.tools.wasm_module import module_abi

__all__ = [
    "ToolEntry",
    "Toolset",
    "resolve_toolset",
    "configured_toolset",
    "MODEL_NAME",
    "model_name",
    "PROCESS_SCHEMA",
    "Interpreters",
    "Confinement",
    "McpLookup",
    "MCP_MODEL_SEPARATOR",
    "SchemaSource",
    "url_schema_refs",
]

MODEL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What providers accept as a tool name."""

PROCESS_SCHEMA: dict[str, Any] = {"type": "object"}
"""Arguments of a process tool without ``input_schema_ref``: any JSON object, passed on as is."""

_SCHEMA_MAX_BYTES = 256 * 1024

Interpreters = Callable[[str], str | None]
"""``"python3"``/``"node"`` -> the absolute interpreter path, or None when it is not installed."""

Confinement = Callable[[], "str | None"]
"""Why this host cannot confine a process tool's files (:attr:`ToolConfinement.problem
<covenant.runtime.tool_confinement.ToolConfinement.problem>`), or None; asked only when a process tool is met."""

McpLookup = Callable[[str, str], "McpTool | str"]
"""(server, tool) -> the tool as the connected server advertises it, or why it is unavailable now."""

SchemaSource = Callable[[SchemaUrl], bytes]
"""A schema URL -> its bytes, or SchemaFetchError saying why not: the daemon fetches and caches
(:func:`covenant.tools.schema_refs.fetch_schema`); a view without the daemon has none."""

MCP_TIMEOUT_MS = 30_000
"""How long one MCP tool call may take (never past the intent's deadline)."""

MCP_MODEL_SEPARATOR = "__"
"""MCP tools are sent to models as ``<server>__<tool>``."""


@dataclass(frozen=True)
class ToolEntry:
    """One tool the model is offered."""

    entry: str
    """As the toolset names it: ``rune@system-time``, ``analyse_sentiment``."""
    model_name: str
    action: str
    """The capability action a call needs (``tool.system_time``)."""
    kind: Literal["builtin", "process", "agent", "mcp", "container"]
    description: str
    parameters: dict[str, Any]
    descriptor: ToolDescriptor
    builtin: Builtin | None = None
    argv: tuple[str, ...] = ()
    """A process tool's command line (interpreter, module); empty for built-ins."""
    read_only: tuple[str, ...] = ()
    """What its run may read beyond the system's files and its package (a wasm tool: wasmtime's interpreter
    prefix and covenant's runner script)."""
    image: str | None = None
    """A container tool's image (its ``module``), run by :mod:`covenant.tools.containers`."""
    output_schema: dict[str, Any] | None = None
    validator: Any = field(default=None, compare=False, repr=False)
    """The compiled argument validator (jsonschema, draft 2020-12)."""
    output_validator: Any = field(default=None, compare=False, repr=False)
    mcp: McpTool | None = None
    """An MCP tool as its server advertises it (``kind == "mcp"``)."""

    @property
    def declares_network(self) -> bool:
        """Its descriptor declares the ``network`` capability: without it a process tool gets no network."""
        return "network" in self.descriptor.capabilities

    @property
    def declares_filesystem(self) -> bool:
        """Its descriptor declares the ``filesystem`` capability: a process tool then also gets the agent's
        workspace, read-write, as its working directory."""
        return "filesystem" in self.descriptor.capabilities

    def openai(self) -> dict[str, Any]:
        """This tool in OpenAI's ``tools`` format."""
        return {
            "type": "function",
            "function": {"name": self.model_name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class Toolset:
    """An agent's toolset as this host serves it."""

    available: dict[str, ToolEntry] = field(default_factory=dict)
    """Model-facing name -> tool, in toolset order."""
    unavailable: tuple[tuple[str, str], ...] = ()
    """(toolset entry, why it is not offered)."""


def model_name(entry: str) -> str:
    """The name sent to models: ``rune@file-read`` -> ``file-read``, ``git/git_status`` -> ``git__git_status``;
    custom names unchanged."""
    if MCP_SEPARATOR in entry:
        return entry.replace(MCP_SEPARATOR, MCP_MODEL_SEPARATOR, 1)
    return entry.removeprefix(BUILTIN_PREFIX)


class _Unavailable(Exception):
    pass


def url_schema_refs(tool: ToolDescriptor) -> list[str]:
    """The tool's schema refs that are URLs (fetched by the running daemon, not judged without it)."""
    out = []
    for ref in (tool.input_schema_ref, tool.output_schema_ref):
        try:
            if ref and parse_schema_url(ref) is not None:
                out.append(ref)
        except SchemaFetchError:
            out.append(ref)  # a URL with a bad pin: the daemon reports it
    return out


def _load_schema(root: Path, ref: str, what: str, schemas: SchemaSource | None) -> dict[str, Any]:
    """A JSON schema file inside the package (JSON or YAML), or at a URL, checked as a draft 2020-12 schema."""
    try:
        url = parse_schema_url(ref)
    except SchemaFetchError as exc:
        raise _Unavailable(f"{what} {exc}") from None
    if url is not None:
        if schemas is None:
            raise _Unavailable(f"{what} {url.url} is fetched by the daemon when it serves the agent (not here)")
        try:
            data = schemas(url)
        except SchemaFetchError as exc:
            raise _Unavailable(f"{what}: {exc}") from None
        return _schema_document(data, f"{what} {url.url}", as_json=True)
    path = Path(os.path.normpath(root / ref))
    if not is_inside(os.path.realpath(path), os.path.realpath(root)):
        raise _Unavailable(f"{what} {ref!r} leaves the package folder")
    problems = ownership_problems(path, what)
    if problems:
        raise _Unavailable(problems[0].message)
    try:
        with open(path, "rb") as f:
            data = f.read(_SCHEMA_MAX_BYTES + 1)
    except OSError as exc:
        raise _Unavailable(f"cannot read {what} {path}: {exc.strerror}") from None
    if len(data) > _SCHEMA_MAX_BYTES:
        raise _Unavailable(f"{what} {path} is larger than {_SCHEMA_MAX_BYTES} bytes")
    return _schema_document(data, f"{what} {path}", as_json=path.suffix == ".json")


def _schema_document(data: bytes, where: str, *, as_json: bool) -> dict[str, Any]:
    import yaml

    try:
        text = data.decode("utf-8")
        schema = json.loads(text) if as_json else yaml.load(text, Loader=safe_loader())  # noqa: S506
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise _Unavailable(f"{where} is not a JSON/YAML document: {exc}") from None
    if not isinstance(schema, dict):
        raise _Unavailable(f"{where} must be a JSON schema object")
    problem = schema_problem(schema)
    if problem is not None:
        raise _Unavailable(f"{where}: {problem}")
    return schema


def _tool_schemas(
    package: RunePackage, tool: ToolDescriptor, schemas: SchemaSource | None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the parameters offered to the model, the output schema) of one of the package's own tools."""
    parameters = PROCESS_SCHEMA
    if tool.input_schema_ref:
        parameters = _load_schema(package.root, tool.input_schema_ref, "input_schema_ref", schemas)
        if parameters.get("type") != "object":
            raise _Unavailable(f"input_schema_ref {tool.input_schema_ref!r} must describe an object (type: object)")
    output_schema = (_load_schema(package.root, tool.output_schema_ref, "output_schema_ref", schemas)
                     if tool.output_schema_ref else None)
    return parameters, output_schema


def _known_capabilities(tool: ToolDescriptor) -> None:
    """Unavailable when the tool declares a capability covenant cannot grant."""
    unknown = [name for name in tool.capabilities if name not in TOOL_CAPABILITIES]
    if unknown:
        raise _Unavailable(
            f"it declares the capability {unknown[0]!r}, which covenant cannot grant (known: {', '.join(TOOL_CAPABILITIES)})"
        )


def _package_tool(tool: ToolDescriptor, kind: str, schemas: tuple[dict[str, Any], dict[str, Any] | None],
                  **run: Any) -> ToolEntry:
    """The entry of one of the package's own tools; ``run`` says how it runs (argv, image, read_only)."""
    parameters, output_schema = schemas
    return ToolEntry(
        entry=tool.name,
        model_name=tool.name,
        action=tool_action(tool.name),
        kind=kind,
        description=f"The package's own tool {tool.name} (version {tool.version}).",
        parameters=parameters,
        descriptor=tool,
        output_schema=output_schema,
        **run,
    )


def _process_entry(
    package: RunePackage, tool: ToolDescriptor, interpreters: Interpreters, confinement: Confinement,
    schemas: SchemaSource | None,
) -> ToolEntry:
    module = Path(os.path.normpath(package.root / tool.module))
    if not module.is_file():
        raise _Unavailable(f"its module {module} does not exist")
    if module.suffix == ".py":
        interpreter = interpreters("python3")
        if interpreter is None:
            raise _Unavailable("needs the python3 interpreter ([runtime] python3), which was not found")
        argv: tuple[str, ...] = (interpreter, str(module))
    elif module.suffix == ".js":
        interpreter = interpreters("node")
        if interpreter is None:
            raise _Unavailable("needs the node interpreter ([runtime] node), which was not found")
        argv = (interpreter, str(module))
    else:
        if not os.access(module, os.X_OK):
            raise _Unavailable(f"its module {module} is neither .py nor .js and not executable (chmod +x it)")
        argv = (str(module),)
    schema = _tool_schemas(package, tool, schemas)
    _known_capabilities(tool)
    problem = confinement()
    if problem is not None:
        raise _Unavailable(f"its files cannot be confined on this host ({problem}), and a process tool never runs unconfined")
    return _package_tool(tool, "process", schema, argv=argv)


_WASM_MAX_BYTES = 64 * 1024 * 1024


def _wasm_entry(
    package: RunePackage, tool: ToolDescriptor, config: Config, confinement: Confinement, schemas: SchemaSource | None,
) -> ToolEntry:
    """A ``runtime: wasm`` tool: its module run by :mod:`covenant.tools.wasm_runner` through the tool runner."""
    module = Path(os.path.normpath(package.root / tool.module))
    try:
        with open(module, "rb") as f:
            data = f.read(_WASM_MAX_BYTES + 1)
    except OSError as exc:
        raise _Unavailable(f"cannot read its module {module}: {exc.strerror}") from None
    if len(data) > _WASM_MAX_BYTES:
        raise _Unavailable(f"its module {module} is larger than {_WASM_MAX_BYTES} bytes")
    try:
        abi = module_abi(data)
    except ValueError as exc:
        raise _Unavailable(f"its module {module} cannot run here: {exc}") from None
    backend = wasm_backend(config)
    if isinstance(backend, str):
        raise _Unavailable(backend)
    schema = _tool_schemas(package, tool, schemas)
    if tool.capabilities:
        raise _Unavailable(f"a wasm tool gets no files and no network; it declares {', '.join(tool.capabilities)}")
    problem = confinement()
    if problem is not None:
        raise _Unavailable(f"its files cannot be confined on this host ({problem}), and a wasm tool never runs unconfined")
    memory = config.rune.memory_mb(package.runefile.runtime.resource_profile) * 1024 * 1024
    fuel = tool.timeout_ms * config.tools.wasm.fuel_per_ms
    return _package_tool(
        tool, "process", schema, read_only=backend.read_only,
        argv=(*backend.prefix, str(module), abi, str(fuel), str(memory), str(config.tools.wasm.output_max_bytes)),
    )


def _container_entry(package: RunePackage, tool: ToolDescriptor, config: Config, schemas: SchemaSource | None) -> ToolEntry:
    """A ``runtime: container`` tool: its ``module`` is the image, run by rootful podman as the agent's uid."""
    image = tool.module.strip()
    if not image:
        raise _Unavailable("runtime 'container' needs the image reference in module (listed in [tools.container] images)")
    problem = image_problem(config, image)
    if problem is not None:
        raise _Unavailable(f"runtime 'container': {problem}")
    _known_capabilities(tool)
    return _package_tool(tool, "container", _tool_schemas(package, tool, schemas), image=image)


def _outside_reference(schema: Any) -> str | None:
    """The first ``$ref``/``$dynamicRef`` that does not point inside the schema (``#…``), or None.

    A server's schema must stand alone: jsonschema would fail the call at
    validation time on a reference it cannot resolve (it never fetches one).
    """
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("$ref", "$dynamicRef") and not (isinstance(value, str) and value.startswith("#")):
                    return str(value)[:200]
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return None


def _mcp_entry(name: str, mcp: McpLookup | None) -> ToolEntry:
    server, _, tool = name.partition(MCP_SEPARATOR)
    if mcp is None:
        raise _Unavailable(f"an MCP tool: available when the daemon is connected to server {server!r} (covenant tools list asks it)")
    found = mcp(server, tool)
    if isinstance(found, str):
        raise _Unavailable(found)
    facing = model_name(name)
    if not MODEL_NAME.match(facing):
        raise _Unavailable(f"its model-facing name {facing!r} cannot be sent to models (must match {MODEL_NAME.pattern})")
    schema = found.input_schema or {"type": "object"}
    problem = schema_problem(schema)
    if problem is None and schema.get("type") != "object":
        problem = "it does not describe an object (type: object)"
    if problem is None and (ref := _outside_reference(schema)) is not None:
        problem = f"it refers to {ref!r} outside itself"
    if problem is not None:
        raise _Unavailable(f"the input schema server {server!r} advertises for {tool!r} is not usable: {problem}")
    return ToolEntry(
        entry=name,
        model_name=facing,
        action=tool_action(name),
        kind="mcp",
        description=found.description or f"The tool {tool} of the MCP server {server}.",
        parameters=schema,
        descriptor=ToolDescriptor.model_construct(name=name, runtime="builtin", timeout_ms=MCP_TIMEOUT_MS),
        mcp=found,
    )


def _entry(
    package: RunePackage, name: str, interpreters: Interpreters, mcp: McpLookup | None, config: Config,
    confinement: Confinement, schemas: SchemaSource | None,
) -> ToolEntry:
    tool = package.tools.get(name)
    if name.startswith(BUILTIN_PREFIX):
        builtin = BUILTINS[name]  # every built-in the loader accepts is implemented (tests/tools/test_tools_builtins.py)
        missing = builtin.needs(config) if builtin.needs is not None else None
        if missing is not None:
            raise _Unavailable(missing)
        return ToolEntry(
            entry=name,
            model_name=model_name(name),
            action=tool_action(name),
            kind="builtin",
            description=builtin.description,
            parameters=builtin.parameters,
            descriptor=tool or ToolDescriptor.model_construct(name=name, runtime="builtin"),
            builtin=builtin,
        )
    if MCP_SEPARATOR in name and tool is None:
        return _mcp_entry(name, mcp)
    if tool is None:
        raise _Unavailable("no descriptor for it in the package")
    if not MODEL_NAME.match(name):
        raise _Unavailable(f"its name cannot be sent to models (must match {MODEL_NAME.pattern})")
    if tool.runtime == "process":
        return _process_entry(package, tool, interpreters, confinement, schemas)
    if tool.runtime == "wasm":
        return _wasm_entry(package, tool, config, confinement, schemas)
    if tool.runtime == "agent":
        assert tool.agent_ref is not None  # the descriptor requires it
        # A remote URL is offered like a local agent that shares no network: the daemon decides when it is
        # called ([a2a] remotes), as it decides the network rule.
        callee = tool.agent_ref.removeprefix("local://")
        return ToolEntry(
            entry=name,
            model_name=name,
            action=tool_action(name),
            kind="agent",
            description=f"Ask the {'remote ' if '://' in callee else ''}agent {callee} and get its answer.",
            parameters=AGENT_TOOL_SCHEMA,
            descriptor=tool,
        )
    if tool.runtime == "container":
        return _container_entry(package, tool, config, schemas)
    raise _Unavailable(f"runtime {tool.runtime!r} has no backend on this host")


def _with_validators(entry: ToolEntry) -> ToolEntry:
    return replace(
        entry,
        validator=validator_for(entry.parameters),
        output_validator=validator_for(entry.output_schema) if entry.output_schema is not None else None,
    )


def resolve_toolset(
    package: RunePackage, interpreters: Interpreters, mcp: McpLookup | None = None, config: Config | None = None, *,
    confinement: Confinement, schemas: SchemaSource | None = None,
) -> Toolset:
    """Split the package's toolset into offered tools and unavailable entries (toolset order, no repeats).

    ``mcp`` answers for ``server/tool`` entries (the daemon's :class:`~covenant.tools.mcp.McpHub`);
    without it they are unavailable, the reason saying the daemon decides. ``config`` (default: every
    default) decides built-ins that need a configured backend (``rune@web-search``, ``rune@channel-send``).
    ``confinement`` says whether process tools can be confined here: where not, they are unavailable.
    ``schemas`` gives schemas named by URL; without it their tools are unavailable, the reason saying the
    daemon fetches them.
    """
    config = config if config is not None else Config()
    available: dict[str, ToolEntry] = {}
    unavailable: list[tuple[str, str]] = []
    for name in dict.fromkeys(package.runefile.toolset):
        try:
            entry = _entry(package, name, interpreters, mcp, config, confinement, schemas)
        except _Unavailable as exc:
            unavailable.append((name, str(exc)))
            continue
        clash = available.get(entry.model_name)
        if clash is not None:
            unavailable.append((name, f"its model-facing name {entry.model_name!r} is already taken by {clash.entry}"))
            continue
        available[entry.model_name] = _with_validators(entry)
    return Toolset(available=available, unavailable=tuple(unavailable))


def configured_toolset(
    package: RunePackage, config: Config, mcp: McpLookup | None = None, confinement: Confinement | None = None
) -> Toolset:
    """The toolset as a daemon with this config would serve it, without a runner (``agents show``/``check``).

    ``confinement`` (default: judged here, as a daemon run by this user on this host would judge it)
    says whether process tools can be confined; ``tools list`` passes the running daemon's answer.
    """
    from covenant.runtime.host import can_switch_uid
    from covenant.runtime.launch_plans import resolve_program
    from covenant.runtime.tool_confinement import confinement_problem

    runtime = config.runtime

    def interpreters(name: str) -> str | None:
        return resolve_program(getattr(runtime, name), runtime.path)

    def judged_here() -> str | None:
        return confinement_problem(runtime, can_switch_uid())

    return resolve_toolset(package, interpreters, mcp, config, confinement=confinement or judged_here)
