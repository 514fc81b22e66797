"""JSON from outside covenant: parsed so that its shape can never raise anything but ValueError.

``json.loads`` recurses once per level of nesting and raises RecursionError (not ValueError) past
the interpreter's limit, which depends on how deep the caller's own stack already is. A document
of a few hundred ``[`` from an agent's stdout, a request body, a webhook or a remote agent would
then escape every ``except ValueError`` and end as an internal error. And a document that parses
can still be too deep for what handles it next (encoders, validators, canonical bytes all recurse).
So anything read from outside goes through :func:`loads`: past :data:`MAX_DEPTH` levels, or past
the recursion limit, it is a :class:`TooDeep` ValueError naming the limit.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "TooDeep", "loads", "nests_deeper"]

MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted from outside (real documents nest a few levels)."""


class TooDeep(ValueError):
    """The document nests objects and arrays deeper than :data:`MAX_DEPTH`."""

    def __init__(self) -> None:
        super().__init__(f"the JSON nests objects and arrays deeper than {MAX_DEPTH} levels")


def loads(text: str | bytes | bytearray, **options: Any) -> Any:
    """``json.loads(text, **options)``; nesting past :data:`MAX_DEPTH` raises :class:`TooDeep`."""
    try:
        value = json.loads(text, **options)
    except RecursionError:
        raise TooDeep() from None
    if _could_nest_deeper(text) and nests_deeper(value):
        raise TooDeep()
    return value


def _could_nest_deeper(text: str | bytes | bytearray) -> bool:
    """Cheap bound first: a document with at most MAX_DEPTH brackets cannot nest deeper."""
    if isinstance(text, str):
        return text.count("[") + text.count("{") > MAX_DEPTH
    return text.count(b"[") + text.count(b"{") > MAX_DEPTH


def nests_deeper(value: Any, limit: int = MAX_DEPTH) -> bool:
    """True when dicts and lists in ``value`` nest deeper than ``limit``; iterative, safe at any depth."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False
