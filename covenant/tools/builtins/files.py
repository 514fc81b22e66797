"""``rune@file-read``, ``rune@file-write``, ``rune@file-list``, ``rune@apply-patch``: the agent's workspace.

Paths are relative to ``<home>/state/workspaces/<agent id>/`` and resolved
by the kernel beneath it (:mod:`covenant.tools.workspace`); the I/O runs in
a worker thread, never on the daemon's event loop.
"""

from __future__ import annotations

from typing import Any

import trio

from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.workspace import Workspace

__all__ = ["READ", "WRITE", "LIST", "APPLY_PATCH", "TOOLS"]

_PATH = {
    "type": "string",
    "maxLength": 4096,
    "description": "a path relative to the workspace, e.g. src/main.py (no leading /, no ..)",
}


async def _in_workspace(call: BuiltinCall, method: str, *args: Any) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        workspace: Workspace = call.services.workspace(call.ctx.agent.id)
        return getattr(workspace, method)(*args)

    return await trio.to_thread.run_sync(run)


async def _read(call: BuiltinCall) -> dict[str, Any]:
    a = call.arguments
    return await _in_workspace(call, "read", a["path"], a.get("offset", 0), a.get("length"))


async def _write(call: BuiltinCall) -> dict[str, Any]:
    return await _in_workspace(call, "write", call.arguments["path"], call.arguments["content"])


async def _list(call: BuiltinCall) -> dict[str, Any]:
    return await _in_workspace(call, "list", call.arguments.get("path", ""))


async def _apply_patch(call: BuiltinCall) -> dict[str, Any]:
    return await _in_workspace(call, "apply_patch", call.arguments["patch"])


READ = Builtin(
    name="rune@file-read",
    description=(
        "Read a file of your workspace. Returns its content (UTF-8 text, or base64 when it is not text), its size, "
        "and truncated: true when more follows; read on with a larger offset."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": _PATH,
            "offset": {"type": "integer", "minimum": 0, "description": "first byte to read (default 0)"},
            "length": {"type": "integer", "minimum": 1, "description": "most bytes to read (capped by the host)"},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    run=_read,
)

WRITE = Builtin(
    name="rune@file-write",
    description="Write a UTF-8 text file in your workspace, replacing it if it exists; missing parent directories are made.",
    parameters={
        "type": "object",
        "properties": {"path": _PATH, "content": {"type": "string", "description": "the whole new content"}},
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    run=_write,
)

LIST = Builtin(
    name="rune@file-list",
    description="List a directory of your workspace (default: its top): each entry's name, type and a file's size.",
    parameters={
        "type": "object",
        "properties": {"path": {**_PATH, "description": "a directory relative to the workspace (default: the top)"}},
        "additionalProperties": False,
    },
    run=_list,
)

APPLY_PATCH = Builtin(
    name="rune@apply-patch",
    description=(
        "Apply a unified diff (diff -u or git diff) to files of your workspace. /dev/null as the old side creates a "
        "file, as the new side deletes it. Every hunk must match the current content; if one does not, nothing is written."
    ),
    parameters={
        "type": "object",
        "properties": {"patch": {"type": "string", "minLength": 1, "description": "the unified diff"}},
        "required": ["patch"],
        "additionalProperties": False,
    },
    run=_apply_patch,
)

TOOLS = (READ, WRITE, LIST, APPLY_PATCH)
