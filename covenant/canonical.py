"""Canonical JSON: the one byte encoding that is hashed and signed.

Sorted keys, no spaces, UTF-8 with non-ASCII kept as-is, no NaN/Infinity.
Intents, grants and audit records all sign these bytes, so a verifier can
re-encode what it parsed and compare byte for byte.
"""

from __future__ import annotations

from covenant.json_fast import dumps

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["canonical_bytes", "canonical_text", "is_canonical_line", "parse_strict"]


def canonical_text(obj: Any) -> str:
    """Encode ``obj`` as canonical JSON text (no trailing newline)."""
    return dumps(obj, sort_keys=True, compact=True, ensure_ascii=False, allow_nan=False)


def canonical_bytes(obj: Any) -> bytes:
    """Encode ``obj`` as canonical JSON, UTF-8 bytes."""
    return canonical_text(obj).encode("utf-8")


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def _reject_float(text: str) -> Any:
    raise ValueError(f"float {text!r} is not allowed (integers only)")


def _reject_constant(text: str) -> Any:
    raise ValueError(f"{text} is not allowed")


def parse_strict(line: bytes) -> Any:
    """Parse one JSON document, refusing duplicate keys, floats, NaN and invalid UTF-8.

    Nesting past the recursion limit is a ValueError too: the lines parsed here are read back from
    files (sessions, memory) that a process of the agent's uid could have written.
    """
    import json  # here: `covenant dispatch` signs with canonical_bytes and never parses (covenant.json_fast)

    text = line.decode("utf-8")  # strict: raises UnicodeDecodeError on invalid bytes
    try:
        return json.loads(
            text,
            object_pairs_hook=_reject_duplicates,
            parse_float=_reject_float,
            parse_constant=_reject_constant,
        )
    except RecursionError:
        raise ValueError("the JSON nests too deeply to parse") from None


def is_canonical_line(line: bytes) -> bool:
    """True when ``line`` parses strictly and re-encodes to exactly the same bytes."""
    try:
        return canonical_bytes(parse_strict(line)) == line
    except (ValueError, UnicodeDecodeError):
        return False
