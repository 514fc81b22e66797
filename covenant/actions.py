"""Capability action strings: the reserved namespaces and wildcard matching.

Pure functions, no I/O, no covenant imports: the manifest validator (below policy) and the
policy check share them, so they sit beneath both.
"""

from __future__ import annotations

import re

__all__ = ["RESERVED_NAMESPACES", "action_problem", "grant_covers", "is_wildcard"]

RESERVED_NAMESPACES: tuple[str, ...] = ("intent", "memory", "identity", "tool", "agent")

# namespace "." verb, where the verb is dotted segments of [a-z0-9_-]; e.g. tool.web_fetch, memory.write
_ACTION = re.compile(r"^(?P<ns>[a-z]+)\.(?P<verb>[a-z0-9_][a-z0-9_\-]*(?:\.[a-z0-9_][a-z0-9_\-]*)*)$")


def is_wildcard(action: str) -> bool:
    """``tool.*`` grants every action of the ``tool`` namespace."""
    return action.endswith(".*") and action[:-2] in RESERVED_NAMESPACES


def action_problem(action: object, *, allow_wildcard: bool = False) -> str | None:
    """Why ``action`` is not a valid action string, or None when it is."""
    if not isinstance(action, str):
        return f"an action must be a string, got {type(action).__name__}"
    if allow_wildcard and is_wildcard(action):
        return None
    match = _ACTION.match(action)
    namespaces = ", ".join(f"{ns}." for ns in RESERVED_NAMESPACES)
    if match is None:
        ns = action.split(".", 1)[0]
        if "." not in action or ns not in RESERVED_NAMESPACES:
            return f"action {action!r} is outside the reserved namespaces ({namespaces})"
        return f"action {action!r} needs a verb after the dot of lowercase letters, digits, '_' or '-'"
    if match["ns"] not in RESERVED_NAMESPACES:
        return f"action {action!r} is outside the reserved namespaces ({namespaces})"
    return None


def grant_covers(granted: str, required: str) -> bool:
    """True when a granted action (possibly ``ns.*``) covers ``required``."""
    if granted == required:
        return True
    return is_wildcard(granted) and required.startswith(granted[:-1])
