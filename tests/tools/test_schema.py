"""Package schemas: patterns matched under a time budget, so a hostile argument cannot stall the daemon."""

from __future__ import annotations

import json
import re
import time

import pytest

from .conftest import Tools


@pytest.fixture
def tools(confined_tools: Tools) -> Tools:
    """Process tools run only where their files are confined: agent uids (root) and Landlock."""
    return confined_tools


def _package(tools: Tools, name: str, schema: dict) -> object:
    return tools.package(
        name,
        ["t"],
        {
            "tools/t.yaml": "name: t\nruntime: process\nmodule: tools/t.py\ninput_schema_ref: tools/t.json\n",
            "tools/t.py": "import json, sys\njson.dump(json.load(sys.stdin), sys.stdout)\n",
            "tools/t.json": json.dumps(schema),
        },
    )


async def test_a_catastrophic_pattern_is_an_error_not_a_stall(tools: Tools) -> None:
    pattern = "^(a|a)*$"  # exponential backtracking: Python's re needs about 2 minutes for 30 a's and a b
    hostile = "a" * 30 + "b"
    agent = _package(tools, "redos", {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}})
    ctx = tools.ctx(agent, tools.grant("tool.t"))
    assert (await tools.host.call(ctx, "t", {"s": "aaaa"})).ok
    started = time.monotonic()
    result = await tools.host.call(ctx, "t", {"s": hostile})
    assert result.error_code == "invalid_arguments" and "in time" in result.error_message
    agent2 = _package(tools, "redos-keys", {"type": "object", "patternProperties": {pattern: {}}, "additionalProperties": False})
    result = await tools.host.call(tools.ctx(agent2, tools.grant("tool.t")), "t", {hostile: 1})
    assert result.error_code == "invalid_arguments"
    assert time.monotonic() - started < 20  # both, against minutes each with an unbounded regex engine


async def test_patterns_still_validate(tools: Tools) -> None:
    schema = {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}},
        "patternProperties": {"^x-": {"type": "integer"}},
        "additionalProperties": False,
    }
    agent = _package(tools, "patterned", schema)
    ctx = tools.ctx(agent, tools.grant("tool.t"))
    assert (await tools.host.call(ctx, "t", {"id": "ABC-12", "x-n": 3})).ok
    bad_id = await tools.host.call(ctx, "t", {"id": "abc"})
    assert bad_id.error_code == "invalid_arguments" and "does not match" in bad_id.error_message
    bad_extra = await tools.host.call(ctx, "t", {"x-n": "three"})
    assert bad_extra.error_code == "invalid_arguments" and "at x-n" in bad_extra.error_message
    unexpected = await tools.host.call(ctx, "t", {"other": 1})
    assert unexpected.error_code == "invalid_arguments" and "'other' unexpected" in unexpected.error_message


async def test_schemas_the_daemon_cannot_bound_make_the_tool_unavailable(tools: Tools) -> None:
    cases = {
        "unevaluated": {"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False},
        "badregex": {"type": "object", "properties": {"s": {"type": "string", "pattern": "(unclosed"}}},
        "notobject": {"type": "array"},
    }
    for name, schema in cases.items():
        agent = _package(tools, name, schema)
        assert tools.host.offered(agent) == []
        [(entry, reason)] = tools.host.unavailable(agent)
        assert entry == "t" and re.search(r"t\.json", reason), reason
