"""``rune@canvas-present``: rich content (markdown, HTML, a PNG) kept as an artifact of the intent.

covenant has no screen: "presenting" means the content is stored with the
intent (``state/artifacts/``), listed in its dispatch record's ``artifacts``,
saved by ``covenant show ID --save DIR`` and returned to A2A callers as a file
part. HTML is stored, never rendered or run by the daemon.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any


from covenant.runtime.artifacts import ArtifactRefused
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.result import ToolError

__all__ = ["TOOL"]

_FORMATS = {"markdown": "text/markdown", "html": "text/html", "png": "image/png", "text": "text/plain"}
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _name(title: str | None) -> str:
    """A file name from the title: its letters and digits, ``-`` between words; ``canvas`` when none."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", title or "").strip("-")[:60]
    return slug or "canvas"


def _content(fmt: str, content: str) -> bytes:
    if fmt != "png":
        return content.encode("utf-8")
    try:
        data = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise ToolError("artifact_refused", "format png takes the image as base64 in content; that is not base64") from None
    if not data.startswith(_PNG_MAGIC):
        raise ToolError("artifact_refused", "format png: the decoded content is not a PNG image")
    return data


async def _present(call: BuiltinCall) -> dict[str, Any]:
    fmt = call.arguments.get("format", "markdown")
    data = _content(fmt, call.arguments["content"])
    try:
        entry = await call.services.save_artifact(call.ctx.intent_id, _name(call.arguments.get("title")),
                                                  _FORMATS[fmt], data)
    except ArtifactRefused as exc:
        raise ToolError("artifact_refused", str(exc)) from None
    return {"presented": True, "artifact": entry}


TOOL = Builtin(
    name="rune@canvas-present",
    description=("Present rich content to the user: markdown, HTML, plain text or a PNG image (base64). It is kept "
                 "with this request and shown to the user beside your answer; you get back its name and size."),
    parameters={
        "type": "object",
        "properties": {
            "content": {"type": "string", "minLength": 1, "description": "the content; for png, the image as base64"},
            "format": {"type": "string", "enum": sorted(_FORMATS), "description": "default markdown"},
            "title": {"type": "string", "maxLength": 200, "description": "a title; it names the file"},
        },
        "required": ["content"],
        "additionalProperties": False,
    },
    run=_present,
)
