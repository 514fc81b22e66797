"""The one-line stdin/stdout contract (DESIGN.md §4), as pure functions.

No I/O here: the runner feeds bytes in and gets a verdict back, and tests
exercise every rule directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from covenant import outside_json

__all__ = ["intent_line", "ParsedOutput", "parse_output", "preview"]

RESULT_KEYS = frozenset({"intent_id", "status", "text", "sources"})


def intent_line(payload: dict[str, Any]) -> bytes:
    """The intent as one UTF-8 JSON line, newline-terminated."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def preview(data: bytes, limit: int = 120) -> str:
    """The first bytes of some output, printable in an error message."""
    shown = data[:limit].decode("utf-8", "backslashreplace")
    return repr(shown) + (f" (+{len(data) - limit} more bytes)" if len(data) > limit else "")


@dataclass(frozen=True)
class ParsedOutput:
    """What stdout held: a valid result, nothing, or a protocol problem."""

    result: dict[str, Any] | None
    problem: str | None
    empty: bool


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_output(stdout: bytes, intent_id: str) -> ParsedOutput:
    """Check that ``stdout`` is exactly one result line answering ``intent_id``.

    Blank lines are ignored. More than one non-blank line, invalid UTF-8 or
    JSON, a wrong shape or a wrong ``intent_id`` is a problem whose message
    quotes the first bytes of the offending output.
    """
    lines = [line for line in stdout.split(b"\n") if line.strip()]
    if not lines:
        return ParsedOutput(None, None, empty=True)
    if len(lines) > 1:
        return ParsedOutput(
            None,
            f"the agent wrote {len(lines)} non-empty lines on stdout, the contract allows one; "
            f"second line: {preview(lines[1])}",
            empty=False,
        )
    line = lines[0]
    try:
        value = outside_json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        return ParsedOutput(None, f"stdout is not a JSON line ({exc}): {preview(line)}", empty=False)
    problem = _shape_problem(value, intent_id)
    if problem is not None:
        return ParsedOutput(None, f"{problem}: {preview(line)}", empty=False)
    return ParsedOutput(value, None, empty=False)


def _shape_problem(value: Any, intent_id: str) -> str | None:
    if not isinstance(value, dict):
        return f"the result must be a JSON object, got {type(value).__name__}"
    missing = sorted(RESULT_KEYS - value.keys())
    if missing:
        return f"the result lacks {', '.join(missing)}"
    extra = sorted(value.keys() - RESULT_KEYS)
    if extra:
        return f"the result has unknown keys {', '.join(extra)} (allowed: intent_id, status, text, sources)"
    if value["intent_id"] != intent_id:
        return f"intent_id {value['intent_id']!r} does not echo the intent's id {intent_id!r}"
    if value["status"] not in ("ok", "error"):
        return f"status must be \"ok\" or \"error\", got {value['status']!r}"
    if not isinstance(value["text"], str):
        return f"text must be a string, got {type(value['text']).__name__}"
    sources = value["sources"]
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        return "sources must be a list of strings"
    return None
