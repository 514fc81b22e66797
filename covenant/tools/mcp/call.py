"""An MCP ``tools/call`` answer as the result given back to the model."""

from __future__ import annotations

from typing import Any

from covenant.tools.result import ToolResult, capped

__all__ = ["mcp_result"]

_ERROR_TEXT_MAX = 2000


def _content(answer: Any) -> list[dict[str, Any]]:
    """The answer's content blocks as JSON (text as is; images and other media described, not inlined)."""
    blocks: list[dict[str, Any]] = []
    for block in getattr(answer, "content", None) or []:
        kind = getattr(block, "type", "unknown")
        if kind == "text":
            blocks.append({"type": "text", "text": block.text})
        else:
            blocks.append({"type": kind, "note": f"a {kind} block (not passed on to the model)"})
    return blocks


def mcp_result(model_name: str, answer: Any) -> ToolResult:
    """``structured_content`` when the server gave one, else ``{"content": [...]}``; ``is_error`` -> tool_failed."""
    if getattr(answer, "is_error", False):
        text = " ".join(b.get("text", "") for b in _content(answer)).strip()[:_ERROR_TEXT_MAX]
        return ToolResult.failure("tool_failed", f"{model_name} answered an error: {text or '(no text)'}")
    structured = getattr(answer, "structured_content", None)
    if structured is not None:
        return capped(structured)
    return capped({"content": _content(answer)})
