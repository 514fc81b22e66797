"""Why a built-in the loader accepts is not offered on this host (design/rune-host.md §8).

Reasons are shown by ``agents show``, ``dispatch --dry-run`` and
``tools list`` (built-ins that need a configured backend say so through
:attr:`~covenant.tools.builtins.base.Builtin.needs`); a tool with a reason is never offered to the model and a
call to it is ``unknown_tool``.
"""

from __future__ import annotations

__all__ = ["builtin_unavailable_reason"]


def builtin_unavailable_reason(name: str) -> str:
    """The reason a ``rune@`` built-in with no implementation here is unavailable."""
    return "not built yet in this version"
