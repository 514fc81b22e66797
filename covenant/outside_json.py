"""JSON from outside covenant: parsed so that its shape can never raise anything but ValueError.

``json.loads`` recurses once per level of nesting and raises RecursionError (not ValueError) past
the interpreter's limit, which depends on how deep the caller's own stack already is. A document
of a few hundred ``[`` from an agent's stdout, a request body, a webhook or a remote agent would
then escape every ``except ValueError`` and end as an internal error. And a document that parses
can still be too deep for what handles it next (encoders, validators, canonical bytes all recurse).
So anything read from outside goes through :func:`loads`: past :data:`MAX_DEPTH` levels, or past
the recursion limit, it is a :class:`TooDeep` ValueError naming the limit.

A JSON string may also hold a lone surrogate (``"\\ud800"``, or the raw bytes ``ED A0 80`` that
``json.loads`` of bytes lets through): a ``str`` no UTF-8 encoder takes, which would fail the audit
record, the dispatch record or the next request much later, where it loses a record. So
:func:`loads` replaces each lone surrogate with U+FFFD (what an agent's or a provider's answer
gets), or, with ``surrogates="refuse"``, raises :class:`LoneSurrogate` (what a signed request
gets: its bytes are what was signed, and covenant does not act on other text than that).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Literal

__all__ = ["MAX_DEPTH", "TooDeep", "LoneSurrogate", "loads", "nests_deeper", "holds_lone_surrogate", "may_hold_surrogate", "scrub"]

MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted from outside (real documents nest a few levels)."""


class TooDeep(ValueError):
    """The document nests objects and arrays deeper than :data:`MAX_DEPTH`."""

    def __init__(self) -> None:
        super().__init__(f"the JSON nests objects and arrays deeper than {MAX_DEPTH} levels")


class LoneSurrogate(ValueError):
    """The document holds a lone surrogate (``\\ud800``): text no UTF-8 encoder takes."""

    def __init__(self) -> None:
        super().__init__("the JSON holds a lone surrogate (such as \\ud800): it is not valid Unicode text")


_SURROGATE = re.compile("[\ud800-\udfff]")
"""A surrogate code point in a decoded ``str``: json.loads pairs valid ones, so any left is lone."""
_MAY_HOLD_STR = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
_MAY_HOLD_BYTES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
"""Cheap bound first: a surrogate escape, a raw surrogate (str), or its UTF-8-like bytes (bytes, which
json.loads decodes with ``surrogatepass``). Most documents hold none and are never walked."""


def loads(text: str | bytes | bytearray, *, surrogates: Literal["replace", "refuse"] = "replace",
          **options: Any) -> Any:
    """``json.loads(text, **options)``; nesting past :data:`MAX_DEPTH` raises :class:`TooDeep`; each lone
    surrogate in a string (keys too) becomes U+FFFD, or raises :class:`LoneSurrogate` with
    ``surrogates="refuse"``."""
    try:
        value = json.loads(text, **options)
    except RecursionError:
        raise TooDeep() from None
    if _could_nest_deeper(text) and nests_deeper(value):
        raise TooDeep()
    if may_hold_surrogate(text):
        if surrogates == "refuse":
            if _holds_surrogate(value):
                raise LoneSurrogate()
        else:
            value = scrub(value)
    return value


def may_hold_surrogate(text: str | bytes | bytearray) -> bool:
    """Could ``text`` decode to a lone surrogate? (A cheap scan; False means it cannot.)"""
    if isinstance(text, str):
        return _MAY_HOLD_STR.search(text) is not None
    return _MAY_HOLD_BYTES.search(text) is not None


def holds_lone_surrogate(body: bytes) -> bool:
    """Would ``body``, parsed as JSON, hold a lone surrogate? False for a body that is not JSON (its own
    door refuses that). For a listener to refuse such a body before it reads it as a request."""
    if _MAY_HOLD_BYTES.search(body) is None:
        return False
    try:
        loads(body, surrogates="refuse")
    except LoneSurrogate:
        return True
    except ValueError:
        return False
    return False


def _strings(value: Any) -> Iterator[str]:
    """Every str in ``value`` (dict keys too), iteratively."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _holds_surrogate(value: Any) -> bool:
    return any(_SURROGATE.search(s) is not None for s in _strings(value))


def scrub(value: Any) -> Any:
    """``value`` with each lone surrogate in its strings (and dict keys) replaced by U+FFFD.

    Lists and dicts are changed in place (those json.loads made are the caller's alone); a str is
    returned anew. Iterative: safe at any depth.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            for index, child in enumerate(item):
                if isinstance(child, str):
                    if _SURROGATE.search(child) is not None:
                        item[index] = _SURROGATE.sub("\ufffd", child)
                elif isinstance(child, (list, dict)):
                    pending.append(child)
        elif isinstance(item, dict):
            if any(_SURROGATE.search(key) is not None for key in item):
                pairs = list(item.items())
                item.clear()
                item.update((_SURROGATE.sub("\ufffd", key), child) for key, child in pairs)
            for key, child in item.items():
                if isinstance(child, str):
                    if _SURROGATE.search(child) is not None:
                        item[key] = _SURROGATE.sub("\ufffd", child)
                elif isinstance(child, (list, dict)):
                    pending.append(child)
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
