"""The built-in tools this host runs, by ``rune@`` name.

Adding one is one module exposing a :class:`~covenant.tools.builtins.base.Builtin`
and one line below; everything else (offering, validation, capability,
audit, retries, the result cap) is the host's.
"""

from __future__ import annotations

from covenant.tools.builtins import memory, schedules, system_time
from covenant.tools.builtins.base import Builtin, BuiltinCall

__all__ = ["BUILTINS", "Builtin", "BuiltinCall"]

BUILTINS: dict[str, Builtin] = {
    tool.name: tool
    for tool in (
        system_time.TOOL,
        *memory.TOOLS,
        *schedules.TOOLS,
    )
}
