"""``rune@system-time``: the current time, UTC."""

from __future__ import annotations

from typing import Any

from covenant.clock import iso_ms, now_ms
from covenant.tools.builtins.base import NO_ARGUMENTS, Builtin, BuiltinCall

__all__ = ["TOOL"]


async def _run(call: BuiltinCall) -> dict[str, Any]:
    ms = now_ms()
    return {"utc": iso_ms(ms), "epoch_ms": ms}


TOOL = Builtin(
    name="rune@system-time",
    description="The current date and time: UTC as ISO 8601 with milliseconds, and milliseconds since the Unix epoch.",
    parameters=NO_ARGUMENTS,
    run=_run,
)
