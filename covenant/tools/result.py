"""What a tool call gives back: a :class:`ToolResult`, its error codes, and how a model sees it.

A tool never raises at the loop: every failure is an error result with a
stable ``error_code`` (listed in :data:`ERROR_CODES`, documented in
docs/tools.md) and a sentence for the model. :func:`model_content` renders a
result as the content of an OpenAI ``tool`` message; an error becomes
``{"error": {"code", "message"}}`` (design/rune-host.md §8).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from covenant.outside_json import MAX_DEPTH, nests_deeper

__all__ = [
    "ToolResult",
    "ToolError",
    "ERROR_CODES",
    "DENIED_CODES",
    "RESULT_MAX_BYTES",
    "model_content",
    "capped",
    "runner_answer",
]

RESULT_MAX_BYTES = 64 * 1024
"""Largest result (its JSON, UTF-8) handed back to the model; larger is ``result_too_large``."""

ERROR_CODES: dict[str, str] = {
    "unknown_tool": "the name is not a tool this agent is offered (not in its toolset, or unavailable here)",
    "invalid_arguments": "the arguments are not a JSON object matching the tool's schema",
    "capability_denied": "the issuer holds no active grant of the tool's capability action",
    "tool_timeout": "the tool did not finish within its timeout_ms or the intent's remaining time",
    "tool_failed": "the tool ran and failed (non-zero exit, killed by a signal, a limit crossed, or an error of a built-in)",
    "tool_bad_output": "a process tool wrote no JSON document, or more than one, on stdout",
    "tool_unavailable": "the tool could not be started (interpreter or module missing)",
    "result_too_large": f"the result is larger than {RESULT_MAX_BYTES} bytes of JSON",
    "memory_corrupt": "the agent's memory file failed verification and is not loaded",
    "memory_full": "the agent's memory holds the most keys allowed",
    "path_refused": "the path leaves the agent's workspace or goes through something that could (absolute, '..', "
    "a symlink out, a /proc magic link, a hard-linked file or one the agent's uid does not own)",
    "file_not_found": "no file or directory at that path in the workspace",
    "wrong_file_type": "a directory where a file is needed or the reverse, or a device, FIFO or socket",
    "file_too_large": "the content to write is larger than [tools.files] write_max_bytes, or a media tool's file is past "
    "[tools.media] input_max_bytes / output_max_bytes",
    "media_unreadable": "a media tool's file is not audio, video or an image its backend can read",
    "patch_failed": "the patch does not parse or a hunk does not match; nothing was written",
    "address_refused": "the URL's scheme or address is refused (not http/https; loopback, link-local, private or "
    "special without [tools.web_fetch] allow, or [tools.browser] allow for the browser)",
    "fetch_failed": "the fetch could not connect, or the server broke the exchange",
    "process_not_found": "no supervised process with that id belongs to this agent",
    "process_limit": "the agent already has [tools.process] max_per_agent processes",
    "browser_limit": "the agent already has [tools.browser] max_per_agent browsers open",
    "element_not_found": "no element of the browser's page matches the selector (nor a link or button with that text)",
    "agent_refused": "a call to another agent was refused before it ran (no shared network, max_depth, the issuer's grants, no such agent)",
    "agent_failed": "the called agent ran and did not end with outcome ok",
    "spawn_refused": "agent-spawn or agent-kill was refused (an invalid manifest, tools the spawner lacks, "
    "[rune] spawned_max reached, or an agent this one did not spawn)",
    "store_corrupt": "the agent's knowledge, tasks or events file failed verification and is not loaded",
    "store_full": "the agent's knowledge, tasks or events store holds the most allowed",
    "unknown_entity": "knowledge-add-relation named an entity that does not exist",
    "unknown_task": "no task with that id on the agent's board",
    "task_not_open": "the task is claimed or done already",
    "artifact_refused": "the file was not kept as an artifact of the intent: a bad name or content, or the intent's "
    "[tools.artifacts] caps (files, bytes) reached",
}
"""Every ``error_code`` a tool call can end with, and what it means."""

DENIED_CODES = frozenset({"capability_denied", "path_refused", "address_refused", "agent_refused", "spawn_refused"})
"""Error codes audited with outcome ``denied`` rather than ``error``."""


class ToolError(Exception):
    """Raised inside a tool to end the call with an error result (never reaches the loop)."""

    def __init__(self, code: str, message: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown tool error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ToolResult:
    """The answer to one tool call: ``content`` when ``ok``, else an error code and message."""

    ok: bool
    content: Any = None
    """JSON-able, at most :data:`RESULT_MAX_BYTES` once encoded; None on error."""
    error_code: str | None = None
    error_message: str | None = None
    left_behind: int = 0
    """Processes the call's run left running when its own process ended, killed then (process tools,
    ``rune@shell-exec``); recorded in the ``tool.call`` event."""
    asks: str | None = None
    """``rune@ask-user``'s question: the loop ends the intent's turn with it, the answer awaited from the
    user (an A2A task then stands ``INPUT_REQUIRED``). No other tool sets it."""

    @classmethod
    def success(cls, content: Any) -> "ToolResult":
        return cls(ok=True, content=content)

    @classmethod
    def failure(cls, code: str, message: str) -> "ToolResult":
        if code not in ERROR_CODES:
            raise ValueError(f"unknown tool error code {code!r}")
        return cls(ok=False, error_code=code, error_message=message)

    @property
    def outcome(self) -> str:
        """``ok``, ``denied`` or ``error``: the ``outcome`` of the ``tool.call`` audit event."""
        if self.ok:
            return "ok"
        return "denied" if self.error_code in DENIED_CODES else "error"

    def to_json(self) -> dict[str, Any]:
        """``{"ok": true, "content": …}`` (and ``"asks"`` for ``rune@ask-user``) or ``{"ok": false, "error":
        {"code", "message"}}`` (for the replica socket)."""
        if self.ok:
            return {"ok": True, "content": self.content, **({"asks": self.asks} if self.asks is not None else {})}
        return {"ok": False, "error": {"code": self.error_code, "message": self.error_message}}


def _encode(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def model_content(result: ToolResult) -> str:
    """The OpenAI ``tool`` message content for ``result``.

    Success: the content as JSON text (a string result is sent as is, not
    quoted again). Error: ``{"error": {"code": …, "message": …}}``. The
    Anthropic adapter sends the same text in a ``tool_result`` with
    ``is_error`` set to ``not result.ok``.
    """
    if not result.ok:
        return _encode({"error": {"code": result.error_code, "message": result.error_message}})
    if isinstance(result.content, str):
        return result.content
    return _encode(result.content)


def capped(content: Any) -> ToolResult:
    """``content`` as a success; ``result_too_large`` over the cap, ``tool_bad_output`` when not JSON or too deep."""
    if nests_deeper(content):
        return ToolResult.failure("tool_bad_output", f"the tool's result nests deeper than {MAX_DEPTH} levels")
    try:
        size = len(_encode(content).encode("utf-8"))
    except (TypeError, ValueError) as exc:
        return ToolResult.failure("tool_bad_output", f"the tool's result is not JSON text in valid Unicode: {exc}")
    if size > RESULT_MAX_BYTES:
        return ToolResult.failure(
            "result_too_large",
            f"the tool's result is {size} bytes of JSON, over the {RESULT_MAX_BYTES}-byte cap; ask for less",
        )
    return ToolResult.success(content)


def runner_answer(answer: object, runner: str) -> dict[str, Any]:
    """The ``ok`` document of a runner script's answer line (``{"ok": {...}}``), or its ``{"error": {"code",
    "message"}}`` raised as that ToolError (a known code only, the message cut at 2,000 characters); anything
    else is ``tool_failed`` naming ``runner`` (the media runner, the browser runner)."""
    if isinstance(answer, dict) and isinstance(answer.get("ok"), dict):
        return answer["ok"]
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict) and error.get("code") in ERROR_CODES and isinstance(error.get("message"), str):
        raise ToolError(error["code"], error["message"][:2000])
    raise ToolError("tool_failed", f"the {runner} answered something other than {{ok}} or {{error}}")
