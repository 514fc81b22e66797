"""Rune packages: Runefile fields and defaults, tools, toolset mapping, safe YAML, error kinds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from covenant.manifest import _yamlio
from covenant.manifest.problems import ManifestError, Problem
from covenant.manifest.runefile import load_rune_package
from covenant.manifest.tools import BUILTIN_TOOLS, tool_action
from tests.manifest.helpers import VALID_RUNEFILE, VALID_TOOL, VALID_WORKFLOW, write_rune


def _problems(folder: Path) -> list[Problem]:
    with pytest.raises(ManifestError) as info:
        load_rune_package(folder)
    return info.value.problems


def test_valid_package_becomes_a_rune_agent(tmp_path: Path) -> None:
    package = load_rune_package(write_rune(tmp_path, workflow=VALID_WORKFLOW))
    spec = package.to_agent_spec()
    assert spec.id == "helper@local" and spec.name == "helper" and spec.version == "0.1.0"
    assert spec.runtime == "rune" and spec.kind == "runefile" and spec.entry is None
    assert spec.manifest_path == tmp_path / "Runefile" and spec.root == tmp_path
    assert spec.capabilities.required == ("tool.web_fetch", "tool.search_kb")
    assert spec.resources.cpu_ms_per_task == 45000
    assert spec.keywords == ("help", "kb")
    assert package.workflow is not None and package.workflow.order() == ("a", "b")
    assert package.tools["search_kb"].module == "tools/search_kb.py"
    assert set(package.tools) >= BUILTIN_TOOLS  # built-ins are injected
    assert tmp_path / "tools" / "search_kb.py" in package.files


def test_runefile_defaults(tmp_path: Path) -> None:
    minimal = "name: m\nversion: 1.0.0\ninstructions: x\ndefault_model: d\nmodels:\n  model_mapping:\n    d: real\n"
    package = load_rune_package(write_rune(tmp_path, minimal, tools={}))
    rf = package.runefile
    assert rf.toolset == () and rf.skills == () and rf.memory_profile == "minimal"
    assert rf.routing_hints == {} and rf.max_steps == 20 and rf.timeout_ms == 30000
    assert rf.networks == ("bridge",)
    rt = rf.runtime
    assert (rt.concurrency_limit, rt.health_probe.path, rt.health_probe.interval_ms) == (10, "/health", 5000)
    assert (rt.startup_timeout_ms, rt.request_timeout_ms, rt.streaming_enabled) == (10000, 30000, True)
    assert (rt.checkpoint_policy, rt.resource_profile) == ("on_finish", "small")
    models = rf.models
    assert models.providers == () and models.fallback_policy == "next_provider"
    assert models.token_budget == 100000 and models.safety_policy == "standard"
    assert package.workflow is None and package.to_agent_spec().capabilities.required == ()


def test_tool_descriptor_defaults(tmp_path: Path) -> None:
    tool = load_rune_package(write_rune(tmp_path)).tools["search_kb"]
    assert (tool.version, tool.runtime, tool.timeout_ms, tool.retry_policy.max_attempts) == ("0.1.0", "process", 5000, 1)
    assert tool.capabilities == () and tool.input_schema_ref is None and tool.output_schema_ref is None
    assert tool.agent_ref is None and tool.max_depth is None


def test_tool_action_mapping() -> None:
    assert tool_action("rune@web-fetch") == "tool.web_fetch"
    assert tool_action("rune@knowledge-add-entity") == "tool.knowledge_add_entity"
    assert tool_action("search_kb") == "tool.search_kb"
    assert len(BUILTIN_TOOLS) == 58  # the Rune spec's 57 and covenant's rune@ask-user
    assert tool_action("rune@ask-user") == "tool.ask_user"


RUNEFILE_FAILING = [
    # (replace, with, field, fragment)
    ("name: helper\n", "", "name", "parse error: required field is missing"),
    ("version: 0.1.0\n", "", "version", "required field is missing"),
    ("default_model: default\n", "", "default_model", "required field is missing"),
    ("name: helper", "name: Helper_1", "name", "lowercase letters"),
    ("name: helper", 'name: ""', "name", "lowercase letters"),
    ("version: 0.1.0", "version: 1.0", "version", "must be a string"),
    ("version: 0.1.0", "version: latest", "version", "not a semver"),
    ("  Be helpful.\n", "  \n", "instructions", "must not be empty"),
    ("  - search_kb", "  - search_kb\n  - rune@teleport", "toolset[2]", "unknown built-in tool"),
    ("  - search_kb", "  - search_kb\n  - ghost", "toolset[2]", "has no descriptor"),
    ("timeout_ms: 45000", "timeout_ms: 0", "timeout_ms", "greater than 0"),
    ("timeout_ms: 45000", 'timeout_ms: "45000"', "timeout_ms", "must be an integer"),
    ("timeout_ms: 45000", "timeout_ms: 45000\nmax_steps: -1", "max_steps", "greater than 0"),
    ("timeout_ms: 45000", "timeout_ms: 45000\nmemory_profile: huge", "memory_profile", "'minimal', 'standard' or 'extended'"),
    ("timeout_ms: 45000", "timeout_ms: 45000\nskills: [not-a-skill]", "skills[0]", "owner/repo/skill-name"),
    ("timeout_ms: 45000", "timeout_ms: 45000\nnetworks: bridge", "networks", "must be a list"),
    ("timeout_ms: 45000", "timeout_ms: 45000\ntimout_ms: 1", "timout_ms", "unknown key"),
    ("keywords: [help, kb]", "keywords: help", "routing_hints.keywords", "list of non-empty strings"),
    ("    default: some-model", "    fast: some-model", "default_model", "not a key of models.model_mapping"),
    ("models:\n", "runtime:\n  concurrency_limit: 0\nmodels:\n", "runtime.concurrency_limit", "greater than 0"),
    ("models:\n", "runtime:\n  health_probe:\n    path: health\nmodels:\n", "runtime.health_probe.path", "starting with '/'"),
    ("models:\n", "runtime:\n  health_probe:\n    interval_ms: 999\nmodels:\n", "runtime.health_probe.interval_ms",
     "below the floor of 1000 ms"),
    ("models:\n", "runtime:\n  streaming_enabled: yes-please\nmodels:\n", "runtime.streaming_enabled", "boolean"),
    ("models:\n", "runtime:\n  checkpoint_policy: sometimes\nmodels:\n", "runtime.checkpoint_policy", "on_finish"),
    ("models:\n", "runtime:\n  resource_profile: huge\nmodels:\n", "runtime.resource_profile", "small"),
    ("models:\n", "runtime:\n  concurency_limit: 2\nmodels:\n", "runtime.concurency_limit", "unknown key"),
    ("models:\n", "models:\n  fallback_policy: retry\n", "models.fallback_policy", "next_provider"),
    ("models:\n", "models:\n  token_budget: 0\n", "models.token_budget", "greater than 0"),
    ("models:\n", "models:\n  safety_policy: lax\n", "models.safety_policy", "standard"),
    ("models:\n", "models:\n  providers: [\"\"]\n", "models.providers[0]", "must not be empty"),
]


@pytest.mark.parametrize(("old", "new", "field", "fragment"), RUNEFILE_FAILING, ids=[c[2] for c in RUNEFILE_FAILING])
def test_runefile_rule_violations(tmp_path: Path, old: str, new: str, field: str, fragment: str) -> None:
    assert old in VALID_RUNEFILE
    problems = _problems(write_rune(tmp_path, VALID_RUNEFILE.replace(old, new, 1)))
    matching = [p for p in problems if p.field == field]
    assert matching, problems
    assert fragment in matching[0].message
    assert matching[0].path == tmp_path / "Runefile"


def test_field_problems_carry_the_yaml_line(tmp_path: Path) -> None:
    problems = _problems(write_rune(tmp_path, VALID_RUNEFILE.replace("timeout_ms: 45000", "timeout_ms: -1")))
    (problem,) = problems
    assert problem.line == VALID_RUNEFILE.splitlines().index("timeout_ms: 45000") + 1


TOOL_FAILING = [
    ("name: search_kb\n", "runtime: process\n", "name", "required field is missing"),
    ("name: search_kb", "name: rune@mine", "name", "reserved for built-in tools"),
    ("name: search_kb", "name: Search KB", "name", "cannot name the action"),
    ("module: tools/search_kb.py", "module: tools/absent.py", "module", "does not exist"),
    ("module: tools/search_kb.py", "module: ../../etc/passwd", "module", "leaves the package folder"),
    ("module: tools/search_kb.py", "module: tools/search_kb.py\nruntime: vm", "runtime", "'wasm', 'process'"),
    ("module: tools/search_kb.py", "module: tools/search_kb.py\ntimeout_ms: 0", "timeout_ms", "greater than 0"),
    ("module: tools/search_kb.py", "module: tools/search_kb.py\nretry_policy:\n  max_attempts: 0", "retry_policy.max_attempts", "greater than or equal to 1"),
    ("module: tools/search_kb.py", "module: tools/search_kb.py\nmax_depth: 0", "max_depth", "greater than or equal to 1"),
    ("module: tools/search_kb.py", "module: tools/search_kb.py\ncapabilities: filesystem", "capabilities", "must be a list"),
    ("module: tools/search_kb.py", "module: tools/search_kb.py\nretries: 2", "retries", "unknown key"),
    ("module: tools/search_kb.py", "", None, "requires module"),
    ("module: tools/search_kb.py", "runtime: agent", None, "requires agent_ref"),
    ("module: tools/search_kb.py", "runtime: agent\nagent_ref: elsewhere", None, "must be local://agent-name"),
    ("module: tools/search_kb.py", "runtime: builtin", None, "reserved for the rune@"),
]


@pytest.mark.parametrize(("old", "new", "field", "fragment"), TOOL_FAILING, ids=[c[3] for c in TOOL_FAILING])
def test_tool_rule_violations(tmp_path: Path, old: str, new: str, field: str | None, fragment: str) -> None:
    tool_text = VALID_TOOL.replace(old, new, 1)
    problems = _problems(write_rune(tmp_path, tools={"kb.yaml": tool_text}))
    tool_problems = [p for p in problems if p.path == tmp_path / "tools" / "kb.yaml"]
    assert tool_problems, problems
    assert tool_problems[0].field == field and fragment in tool_problems[0].message


def test_agent_tool_with_agent_ref_is_valid(tmp_path: Path) -> None:
    delegate = "name: delegate\nruntime: agent\nagent_ref: local://worker-agent\ntimeout_ms: 30000\nmax_depth: 3\n"
    runefile = VALID_RUNEFILE.replace("  - search_kb", "  - search_kb\n  - delegate")
    package = load_rune_package(write_rune(tmp_path, runefile, tools={"kb.yaml": VALID_TOOL, "d.yaml": delegate}))
    assert package.tools["delegate"].max_depth == 3
    assert package.actions() == ("tool.web_fetch", "tool.search_kb", "tool.delegate")


def test_duplicate_tool_names_name_both_files(tmp_path: Path) -> None:
    problems = _problems(write_rune(tmp_path, tools={"a.yaml": VALID_TOOL, "b.yaml": VALID_TOOL}))
    (problem,) = problems
    assert problem.path == tmp_path / "tools" / "b.yaml" and str(tmp_path / "tools" / "a.yaml") in problem.message


def test_python_object_tag_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = VALID_RUNEFILE + f"extra: !!python/object/apply:os.system ['touch {marker}']\n"
    (problem,) = _problems(write_rune(tmp_path, evil))
    assert problem.message.startswith("parse error:") and "python/object" in problem.message
    assert problem.line == len(VALID_RUNEFILE.splitlines()) + 1
    assert not marker.exists()


def test_python_object_tag_in_a_tool_file_is_refused(tmp_path: Path) -> None:
    problems = _problems(write_rune(tmp_path, tools={"kb.yaml": "name: !!python/object:os.getcwd {}\n"}))
    (problem,) = [p for p in problems if p.path.name == "kb.yaml"]
    assert problem.message.startswith("parse error:") and problem.line == 1


def test_the_c_safe_loader_is_used_when_available() -> None:
    import yaml

    loader = _yamlio.safe_loader()
    assert loader in (getattr(yaml, "CSafeLoader", None), yaml.SafeLoader)
    assert issubclass(loader, yaml.SafeLoader) or loader is getattr(yaml, "CSafeLoader", None)


def test_error_kinds_io_parse_validation(tmp_path: Path) -> None:
    (io_problem,) = _problems(tmp_path / "empty-folder")
    assert io_problem.message.startswith("io error:")
    (parse_problem,) = _problems(write_rune(tmp_path / "p", "name: [unclosed\n"))
    assert parse_problem.message.startswith("parse error:") and parse_problem.line is not None
    (top_problem,) = _problems(write_rune(tmp_path / "q", "- a list\n"))
    assert top_problem.message.startswith("parse error:") and "mapping" in top_problem.message
    (validation,) = _problems(write_rune(tmp_path / "v", VALID_RUNEFILE.replace("name: helper", "name: Bad")))
    assert validation.message.startswith("validation error:")


def test_problems_from_every_file_are_reported_together(tmp_path: Path) -> None:
    workflow = VALID_WORKFLOW.replace("depends_on: [a]", "depends_on: [zz]")
    folder = write_rune(
        tmp_path,
        VALID_RUNEFILE.replace("timeout_ms: 45000", "timeout_ms: 0"),
        tools={"kb.yaml": VALID_TOOL, "bad.yaml": "name: [\n"},
        workflow=workflow,
    )
    paths = {p.path.name for p in _problems(folder)}
    assert paths == {"Runefile", "bad.yaml", "workflow.yaml"}


def test_unreadable_tool_file_is_an_io_error(tmp_path: Path) -> None:
    folder = write_rune(tmp_path)
    os.symlink(tmp_path / "nowhere.yaml", folder / "tools" / "dangling.yaml")
    problems = _problems(folder)
    assert any(p.message.startswith("io error:") for p in problems)


MCP_RUNEFILE = VALID_RUNEFILE.replace("  - search_kb\n", "  - search_kb\n  - kb/lookup\n  - github/create_issue\n") + """\
mcp_servers:
  - name: kb
    url: https://kb.example/mcp
    headers:
      Authorization: "Bearer ${KB_TOKEN}"
"""


def test_mcp_servers_and_mcp_toolset_entries(tmp_path: Path) -> None:
    package = load_rune_package(write_rune(tmp_path, MCP_RUNEFILE))
    (server,) = package.runefile.mcp_servers
    assert (server.name, server.url, server.headers) == ("kb", "https://kb.example/mcp", {"Authorization": "Bearer ${KB_TOKEN}"})
    spec = package.to_agent_spec()
    assert spec.capabilities.required[-2:] == ("tool.mcp.kb.lookup", "tool.mcp.github.create_issue")
    # github is not declared: it may be a [mcp.github] stdio server of covenant.toml, so a warning, never an error
    assert len(spec.warnings) == 1 and "'github'" in spec.warnings[0] and "[mcp.github]" in spec.warnings[0]
    assert tool_action("filesystem/read_file") == "tool.mcp.filesystem.read_file"


@pytest.mark.parametrize(
    ("old", "new", "field", "fragment"),
    [
        ("url: https://kb.example/mcp", "url: ftp://kb.example/mcp", "mcp_servers[0].url", "http:// or https://"),
        ("url: https://kb.example/mcp", "url: kb.example", "mcp_servers[0].url", "http:// or https://"),
        ("    url: https://kb.example/mcp\n", "", "mcp_servers[0].url", "required field is missing"),
        ("name: kb", "name: KB", "mcp_servers[0].name", "lowercase"),
        ("Authorization: \"Bearer ${KB_TOKEN}\"", "Authorization: 7", "mcp_servers[0].headers.Authorization", "must be a string"),
        ("Authorization: \"Bearer ${KB_TOKEN}\"", "\"Bad Header\": x", "mcp_servers[0].headers", "not a valid HTTP header name"),
        ("Authorization: \"Bearer ${KB_TOKEN}\"", "Authorization: \"Bearer ${KB-TOKEN}\"", "mcp_servers[0].headers", "not a variable reference"),
        ("    headers:\n", "    timeout: 5\n    headers:\n", "mcp_servers[0].timeout", "unknown key"),
        ("  - kb/lookup\n", "  - kb/Look.up\n", "toolset[2]", "server/tool"),
        ("mcp_servers:", "mcp_server:", "mcp_server", "unknown key"),
    ],
)
def test_bad_mcp_servers_are_refused_with_the_field(tmp_path: Path, old: str, new: str, field: str, fragment: str) -> None:
    assert old in MCP_RUNEFILE
    problems = _problems(write_rune(tmp_path, MCP_RUNEFILE.replace(old, new, 1)))
    assert any(p.field == field and fragment in p.message for p in problems), problems


def test_duplicate_mcp_server_is_refused(tmp_path: Path) -> None:
    text = MCP_RUNEFILE + "  - name: kb\n    url: http://127.0.0.1:9/mcp\n"
    (problem,) = _problems(write_rune(tmp_path, text))
    assert problem.field == "mcp_servers[1].name" and "duplicate MCP server 'kb'" in problem.message


INLINE_RUNEFILE = VALID_RUNEFILE.replace("  - search_kb\n", "  - search_kb\n  - delegate\n  - summarise\n") + """\
tools:
  - name: delegate
    runtime: agent
    agent_ref: local://worker
    max_depth: 2
    timeout_ms: 60000
  - name: summarise
    module: tools/search_kb.py
"""


def test_inline_tools_are_descriptors_like_files_in_tools(tmp_path: Path) -> None:
    package = load_rune_package(write_rune(tmp_path, INLINE_RUNEFILE))
    assert package.tools["delegate"].runtime == "agent" and package.tools["delegate"].agent_ref == "local://worker"
    assert package.tools["summarise"].runtime == "process"
    assert package.to_agent_spec().capabilities.required == ("tool.web_fetch", "tool.search_kb", "tool.delegate", "tool.summarise")


@pytest.mark.parametrize(
    ("old", "new", "field", "fragment"),
    [
        ("    runtime: agent\n    agent_ref: local://worker\n", "    runtime: agent\n", "tools[0]", "requires agent_ref"),
        ("    module: tools/search_kb.py\n", "    module: ../outside.py\n", "tools[1].module", "leaves the package folder"),
        ("    module: tools/search_kb.py\n", "    module: tools/missing.py\n", "tools[1].module", "does not exist"),
        ("    module: tools/search_kb.py\n", "    runtime: wasm\n", "tools[1]", "requires module"),
        ("    module: tools/search_kb.py\n", "    runtime: wasm\n    module: ../outside.wasm\n", "tools[1].module",
         "leaves the package folder"),
        ("  - name: summarise\n", "  - name: summarise\n    sandbox: on\n", "tools[1].sandbox", "unknown key"),
        ("  - name: summarise\n", "  - name: search_kb\n", "name", "also defined in"),  # filed at tools/search_kb.yaml
        ("  - summarise\n", "  - web_fetch\n", "tools[1].name", "built-in rune@web-fetch"),
    ],
)
def test_bad_inline_tools_are_refused_with_the_field(tmp_path: Path, old: str, new: str, field: str, fragment: str) -> None:
    text = INLINE_RUNEFILE.replace(old, new, 1)
    if "web_fetch" in new:
        text = text.replace("  - name: summarise\n", "  - name: web_fetch\n")
    problems = _problems(write_rune(tmp_path, text))
    assert any(p.field == field and fragment in p.message for p in problems), problems


@pytest.mark.parametrize(("runtime", "module"), [("wasm", "tools/search_kb.py"), ("container", "localhost/search:1"),
                                                 ("container", "")])
def test_wasm_and_container_tool_files_load_with_the_package(tmp_path: Path, runtime: str, module: str) -> None:
    """A runtime this host has no backend for is judged when the toolset is served, not at load (issue 37 item 4)."""
    tool = f"name: search_kb\nruntime: {runtime}\n" + (f"module: {module}\n" if module else "")
    package = load_rune_package(write_rune(tmp_path, tools={"search_kb.yaml": tool}))
    assert package.tools["search_kb"].runtime == runtime and package.tools["search_kb"].module == module


@pytest.mark.parametrize("name", ["web_fetch", "memory_store", "shell_exec"])
def test_a_custom_tool_with_a_builtin_action_is_refused(tmp_path: Path, name: str) -> None:
    tool = f"name: {name}\nmodule: tools/search_kb.py\n"
    runefile = VALID_RUNEFILE.replace("  - search_kb\n", f"  - {name}\n")
    problems = _problems(write_rune(tmp_path, runefile, tools={"x.yaml": tool}))
    assert any(p.field == "name" and f"tool.{name}" in p.message and "built-in" in p.message for p in problems), problems
