"""ToolHost: what is offered, and the decision path of every call (name, arguments, schema, grant)."""

from __future__ import annotations

import json
import re

from covenant.clock import now_ms
from covenant.tools import ERROR_CODES, ToolResult, model_content
from covenant.tools.audit import args_sha256

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
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.system_time")), "system-time", "{}")
    after = now_ms()
    assert result.ok, result
    assert before <= result.content["epoch_ms"] <= after
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", result.content["utc"])
    [event] = tools.audit.of("tool.call")
    assert event["outcome"] == "ok" and event["tool"] == "tool.system_time" and event["name"] == "system-time"
    assert event["args_sha256"] == args_sha256({}) and event["intent"] == "intent-1" and event["agent"] == "clock@local"


def test_error_content_is_the_openai_shape() -> None:
    content = model_content(ToolResult.failure("unknown_tool", "no such tool"))
    assert json.loads(content) == {"error": {"code": "unknown_tool", "message": "no such tool"}}
    assert model_content(ToolResult.success({"a": 1})) == '{"a":1}'
    assert set(ERROR_CODES) >= {"unknown_tool", "invalid_arguments", "capability_denied", "tool_timeout"}
