"""The shape of a model request as the gateway accepts it from a replica.

A replica is not trusted: whatever arrives on its gateway socket is checked here before any
adapter reads it, so a malformed or hostile turn is refused with a message naming the field,
never a crash in the daemon nor a request the provider would reject for a reason nobody can see.
"""

from __future__ import annotations

import re
from typing import Any

from covenant.models.types import ModelError

__all__ = ["IMAGE_DATA_URL", "TOOL_NAME", "check_request"]

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ROLES = ("system", "user", "assistant", "tool")


def _bad(where: str, what: str) -> ModelError:
    return ModelError("protocol_error", f"the model request is malformed: {where}: {what}")


IMAGE_DATA_URL = re.compile(r"^data:(image/(?:png|jpeg|gif|webp));base64,([A-Za-z0-9+/]+={0,2})$")
"""The only image a request may carry: inline base64 of a format every provider reads (a URL would make the provider
fetch it, from wherever the sender chose)."""


def _check_image(part: dict[str, Any], where: str) -> None:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str) or not IMAGE_DATA_URL.match(url):
        raise _bad(f"{where}.image_url.url", "must be a data:image/(png|jpeg|gif|webp);base64,… URL")


def _check_content(content: Any, where: str, *, nullable: bool, images: bool = False) -> None:
    if content is None and nullable:
        return
    if isinstance(content, str):
        return
    if isinstance(content, list):
        for index, part in enumerate(content):
            if images and isinstance(part, dict) and part.get("type") == "image_url":
                _check_image(part, f"{where}[{index}]")
                continue
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                allowed = ' and image parts {"type": "image_url", …}' if images else ""
                raise _bad(f"{where}[{index}]", f'only text parts {{"type": "text", "text": …}}{allowed} are supported')
        return
    raise _bad(where, "must be a string" + (" or null" if nullable else ""))


def _check_tool_calls(calls: Any, where: str) -> None:
    if not isinstance(calls, list):
        raise _bad(where, "must be a list")
    for index, call in enumerate(calls):
        at = f"{where}[{index}]"
        if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not call["id"]:
            raise _bad(at, "needs a non-empty string id")
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise _bad(f"{at}.function", "needs a non-empty string name")
        if not isinstance(function.get("arguments", ""), str):
            raise _bad(f"{at}.function.arguments", "must be JSON text (a string)")


def check_request(messages: Any, tools: Any) -> None:
    """Raise ``ModelError("protocol_error")`` unless ``messages`` and ``tools`` are well-formed neutral ones."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _bad(where, "must be an object")
        role = message.get("role")
        if role not in _ROLES:
            raise _bad(f"{where}.role", f"must be one of {', '.join(_ROLES)}")
        _check_content(message.get("content"), f"{where}.content", nullable=role == "assistant", images=role == "user")
        if role == "assistant" and "tool_calls" in message:
            _check_tool_calls(message["tool_calls"], f"{where}.tool_calls")
        if role == "tool":
            if not isinstance(message.get("tool_call_id"), str) or not message["tool_call_id"]:
                raise _bad(f"{where}.tool_call_id", "must be a non-empty string")
            if not isinstance(message.get("is_error", False), bool):
                raise _bad(f"{where}.is_error", "must be a boolean")
    if not isinstance(tools, list):
        raise _bad("tools", "must be a list")
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict):
            raise _bad(where, 'must be {"type": "function", "function": {…}}')
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise _bad(f"{where}.function.name", "must match ^[a-zA-Z0-9_-]{1,64}$")
        if not isinstance(function.get("description", ""), str):
            raise _bad(f"{where}.function.description", "must be a string")
        if not isinstance(function.get("parameters", {}), dict):
            raise _bad(f"{where}.function.parameters", "must be a JSON schema object")
