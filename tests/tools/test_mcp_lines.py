"""A stdio MCP server's stdout line with a lone surrogate is read with U+FFFD, not refused whole (which left
its call waiting for an answer that never came); a line that is not JSON-RPC is still refused."""

from __future__ import annotations

import pytest
import trio

from covenant.tools.mcp.sdk import load_sdk
from covenant.tools.mcp.stdio import _message


@pytest.fixture(scope="module")
def adapter():  # type: ignore[no-untyped-def]
    trio.run(load_sdk)
    import mcp_types

    return mcp_types.jsonrpc_message_adapter


def test_a_lone_surrogate_in_a_result_is_replaced(adapter) -> None:  # type: ignore[no-untyped-def]
    line = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"a\\ud800b"}]}}'
    message = _message(adapter, line)
    assert message.id == 7 and message.result["content"][0]["text"] == "a\ufffdb"


def test_a_line_that_is_not_a_message_is_still_refused(adapter) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        _message(adapter, b'{"not": "json-rpc \\ud800"}')
    with pytest.raises(ValueError):
        _message(adapter, b"not json at all")
