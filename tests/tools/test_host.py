"""ToolHost: what is offered, and the decision path of every call (name, arguments, schema, grant)."""

from __future__ import annotations

import dataclasses
import json
import re

from covenant.clock import now_ms
from covenant.manifest.runefile import load_rune_package
from covenant.tools import ERROR_CODES, ToolResult, model_content
from covenant.tools.catalogue import MODEL_NAME, model_name
from covenant.tools.audit import args_sha256
from tests.conftest import rune_examples

from .conftest import Tools


async def test_system_time_offered_and_answers(tools: Tools) -> None:
    agent = tools.package("clock", ["rune@system-time"])
    assert tools.host.offered(agent) == [
        {
            "type": "function",
            "function": {
                "name": "system-time",
                "description": tools.host.toolset(agent).available["system-time"].description,
                "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
            },
        }
    ]
    before = now_ms()
    ctx = tools.ctx(agent, tools.grant("tool.system_time"))
    result = await tools.host.call(ctx, "system-time", "{}")
    after = now_ms()
    assert result.ok, result
    assert before <= result.content["epoch_ms"] <= after
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", result.content["utc"])
    [event] = tools.audit.of("tool.call")
    assert event["outcome"] == "ok" and event["tool"] == "tool.system_time" and event["name"] == "system-time"
    assert event["args_sha256"] == args_sha256({}) and event["intent"] == ctx.intent_id and event["agent"] == "clock@local"


def test_error_content_is_the_openai_shape() -> None:
    content = model_content(ToolResult.failure("unknown_tool", "no such tool"))
    assert json.loads(content) == {"error": {"code": "unknown_tool", "message": "no such tool"}}
    assert model_content(ToolResult.success({"a": 1})) == '{"a":1}'
    assert set(ERROR_CODES) >= {"unknown_tool", "invalid_arguments", "capability_denied", "tool_timeout"}


async def test_unavailable_built_ins_are_reported_and_never_offered(tools: Tools) -> None:
    agent = tools.package(
        "wishful",
        ["rune@system-time", "rune@location-get", "rune@web-search", "rune@channel-send"],
    )
    assert [t["function"]["name"] for t in tools.host.offered(agent)] == ["system-time"]
    reasons = dict(tools.host.unavailable(agent))
    assert reasons["rune@location-get"].startswith("needs [tools.location] in covenant.toml")
    assert "[tools.web_search]" in reasons["rune@web-search"]
    assert "[channels.NAME]" in reasons["rune@channel-send"]
    grants = tools.grant("tool.*")
    for name in ("location-get", "rune@location-get", "web-search"):
        result = await tools.host.call(tools.ctx(agent, grants), name, {"path": "x"})
        assert result.error_code == "unknown_tool"
        assert "offered: system-time" in result.error_message


async def test_unknown_and_out_of_toolset_names(tools: Tools) -> None:
    agent = tools.package("narrow", ["rune@memory-list"])
    ctx = tools.ctx(agent, tools.grant("tool.*"))
    for name in ("system-time", "nonexistent", "memory-store", "../../etc", "x" * 500):
        result = await tools.host.call(ctx, name, "{}")
        assert result.error_code == "unknown_tool" and not result.ok
        assert len(result.error_message) < 200  # a long name is not echoed back whole
    events = tools.audit.of("tool.call")
    assert len(events) == 5
    assert all(e["outcome"] == "error" and e["error_code"] == "unknown_tool" and e["tool"] is None for e in events)
    assert events[0]["name"] == "system-time"
    assert events[3]["name"] is None and len(events[3]["name_sha256"]) == 64
    assert events[4]["name"] is None


async def test_invalid_json_and_schema_violations(tools: Tools) -> None:
    agent = tools.package("strict", ["rune@system-time", "rune@memory-store"])
    ctx = tools.ctx(agent, tools.grant("tool.*"))
    raw = '{"key": "a", '
    bad_json = await tools.host.call(ctx, "memory-store", raw)
    assert bad_json.error_code == "invalid_arguments" and "not valid JSON" in bad_json.error_message
    assert tools.audit.of("tool.call")[-1]["args_sha256"] == args_sha256(raw)
    for args, fragment in (
        ("[1, 2]", "must be a JSON object"),
        ('{"key": "a", "key": "b", "value": "c"}', "duplicate key"),
        ('{"key": NaN, "value": "c"}', "not valid JSON"),
        ({"key": "a"}, "'value' is a required property"),
        ({"key": 5, "value": "v"}, "at key"),
        ({"key": "a", "value": "v", "extra": 1}, "Additional properties"),
    ):
        result = await tools.host.call(ctx, "memory-store", args)
        assert result.error_code == "invalid_arguments", (args, result)
        assert fragment in result.error_message, (args, result.error_message)
    no_args = await tools.host.call(ctx, "system-time", {"zone": "UTC"})
    assert no_args.error_code == "invalid_arguments"
    blank = await tools.host.call(ctx, "system-time", "")
    assert blank.ok
    assert memory_untouched(tools, agent)


def memory_untouched(tools: Tools, agent) -> bool:
    from covenant.tools.memory_store import memory_dir

    return not (memory_dir(tools.home, agent.id) / "memory.jsonl").exists()


async def test_capability_denied_is_audited_and_nothing_runs(confined_tools: Tools) -> None:
    tools = confined_tools
    agent = tools.package(
        "guarded",
        ["mark", "rune@memory-store"],
        {
            "tools/mark.yaml": "name: mark\nruntime: process\nmodule: tools/mark.py\ncapabilities: [filesystem]\n",
            "tools/mark.py": "import json,sys\njson.load(sys.stdin)\nopen('ran','w').write('x')\nprint('{}')\n",
        },
    )
    ran = tools.workspace(agent) / "ran"
    grants = tools.grant("tool.system_time")  # something, but not these
    for name, args in (("mark", {}), ("memory-store", {"key": "k", "value": "v"})):
        result = await tools.host.call(tools.ctx(agent, grants), name, args)
        assert result.error_code == "capability_denied" and result.outcome == "denied"
        assert "covenant grant" in result.error_message
        content = json.loads(model_content(result))
        assert content["error"]["code"] == "capability_denied"
    assert not ran.exists() and memory_untouched(tools, agent)
    events = tools.audit.of("tool.call")
    assert [(e["name"], e["tool"], e["outcome"], e["attempts"]) for e in events] == [
        ("mark", "tool.mark", "denied", 0),
        ("memory-store", "tool.memory_store", "denied", 0),
    ]
    allowed = await tools.host.call(tools.ctx(agent, tools.grant("tool.mark")), "mark", {})
    assert allowed.ok and ran.exists()


async def test_a_revoked_or_expired_grant_denies(tools: Tools) -> None:
    agent = tools.package("revoked", ["rune@system-time"])
    tools.grant("tool.system_time")
    tools.store.revoke(tools.daemon_key, tools.issuer_pub, ["tool.system_time"])
    result = await tools.host.call(tools.ctx(agent), "system-time", {})
    assert result.error_code == "capability_denied"
    tools.store.add(tools.daemon_key, tools.issuer_pub, ["tool.system_time"], now_ms() + 60_000, None)
    grants = tools.store.load()
    assert (await tools.host.call(tools.ctx(agent, grants), "system-time", {})).ok
    # judged at the later of ctx.now_ms and the wall clock: a context from the past cannot revive it
    late = dataclasses.replace(tools.ctx(agent, grants), now_ms=now_ms() + 120_000)
    assert (await tools.host.call(late, "system-time", {})).error_code == "capability_denied"


async def test_every_call_is_one_event_without_argument_text(tools: Tools) -> None:
    agent = tools.package("counted", ["rune@system-time", "rune@memory-store", "rune@memory-recall"])
    ctx = tools.ctx(agent, tools.grant("tool.system_time", "tool.memory_store"))
    secret = "TOPSECRET-arg-4711"
    calls = [
        ("system-time", {}),
        ("memory-store", {"key": secret, "value": secret}),
        ("memory-store", f'{{"key": "{secret}"'),
        ("memory-recall", {"key": secret}),
        ("nope", {"key": secret}),
        ("memory-store", {"key": "k", "value": secret, "extra": secret}),
    ]
    for name, args in calls:
        await tools.host.call(ctx, name, args)
    events = tools.audit.events
    assert [t for t, _ in events] == ["tool.call"] * len(calls)
    assert [d["outcome"] for _, d in events] == ["ok", "ok", "error", "denied", "error", "error"]
    assert secret not in json.dumps(events)
    assert events[1][1]["args_sha256"] == args_sha256({"key": secret, "value": secret})
    assert all(re.fullmatch(r"[0-9a-f]{64}", d["args_sha256"]) for _, d in events)
    assert all(isinstance(d["ms"], int) and d["ms"] >= 0 for _, d in events)


async def test_a_model_name_clash_keeps_the_built_in(confined_tools: Tools) -> None:
    tools = confined_tools
    agent = tools.package(
        "clash",
        ["rune@system-time", "system-time"],
        {"tools/st.yaml": "name: system-time\nruntime: process\nmodule: tools/st.py\n", "tools/st.py": "print('{}')\n"},
    )
    assert [t["function"]["name"] for t in tools.host.offered(agent)] == ["system-time"]
    [(entry, reason)] = tools.host.unavailable(agent)
    assert entry == "system-time" and "already taken by rune@system-time" in reason


async def test_every_corpus_toolset_entry_is_offered_or_said_unavailable(tools: Tools) -> None:
    corpus = rune_examples()
    packages = sorted(p.parent for p in corpus.rglob("Runefile"))
    assert len(packages) == 10
    reasons: dict[str, str] = {}
    offered_anywhere: set[str] = set()
    for folder in packages:
        package = load_rune_package(folder)
        agent = package.to_agent_spec()
        offered = [t["function"]["name"] for t in tools.host.offered(agent)]
        unavailable = dict(tools.host.unavailable(agent))
        assert all(MODEL_NAME.match(name) for name in offered)
        for entry in package.runefile.toolset:
            assert (model_name(entry) in offered) != (entry in unavailable), (folder.name, entry)
        reasons.update(unavailable)
        offered_anywhere.update(offered)
    assert reasons["filesystem/read_file"].startswith("an MCP tool: available when the daemon is connected to server")
    assert {"researcher", "analyst"} <= offered_anywhere  # the router's agent tools (local://) are offered
    assert "[tools.web_search]" in reasons["rune@web-search"]


async def test_deeply_nested_arguments_are_refused_not_crashed_on(tools: Tools) -> None:
    agent = tools.package("deep", ["rune@memory-store"])
    ctx = tools.ctx(agent, tools.grant("tool.memory_store"))
    for depth in (65, 5000, 100_000):  # past the depth limit; past json's recursion limit
        text = '{"key": "k", "value": ' + "[" * depth + "]" * depth + "}"
        result = await tools.host.call(ctx, "memory-store", text)
        assert result.error_code == "invalid_arguments" and "deeper than 64" in result.error_message, depth
    nested: dict = {}
    inner = nested
    for _ in range(70):
        inner["x"] = {}
        inner = inner["x"]
    result = await tools.host.call(ctx, "memory-store", nested)
    assert result.error_code == "invalid_arguments" and "deeper than 64" in result.error_message
    assert [e["error_code"] for e in tools.audit.of("tool.call")] == ["invalid_arguments"] * 4


async def test_lone_surrogates_in_arguments_are_refused(tools: Tools) -> None:
    agent = tools.package("surrogate", ["rune@memory-store"])
    ctx = tools.ctx(agent, tools.grant("tool.memory_store"))
    for args in ('{"key": "k", "value": "\\ud800"}', {"key": "k", "value": "\ud800"}):
        result = await tools.host.call(ctx, "memory-store", args)
        assert result.error_code == "invalid_arguments" and "Unicode" in result.error_message
    assert memory_untouched(tools, agent)


async def test_an_mcp_tool_whose_advertised_schema_is_not_usable_is_unavailable(tools: Tools) -> None:
    from covenant.tools.catalogue import resolve_toolset
    from covenant.tools.mcp import McpTool

    agent = tools.package("mcpschemas", ["srv/remote", "srv/array", "srv/good", "srv/missing"])
    package = load_rune_package(agent.root)
    advertised = {
        "remote": {"type": "object", "properties": {"a": {"$ref": "http://169.254.169.254/latest"}}},
        "array": {"type": "array"},
        "good": {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "string"}}},
    }

    def lookup(server: str, tool: str) -> McpTool | str:
        if tool not in advertised:
            return f"MCP server {server!r} does not advertise a tool {tool!r}"
        return McpTool(server, tool, "", advertised[tool])

    toolset = resolve_toolset(package, tools.runner.plans.interpreter, lookup,
                              confinement=lambda: tools.runner.tool_confinement.problem)
    assert list(toolset.available) == ["srv__good"]
    reasons = dict(toolset.unavailable)
    assert "outside itself" in reasons["srv/remote"] and "object" in reasons["srv/array"]
    assert "does not advertise" in reasons["srv/missing"]
