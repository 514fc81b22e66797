"""Milliseconds since the epoch: the one time unit of intents, grants and budgets."""

from __future__ import annotations

import time
from datetime import datetime

__all__ = ["now_ms", "iso_ms", "iso_now", "ms_from_iso"]


def now_ms() -> int:
    """Wall-clock time in ms since the epoch (integer: records carry no floats)."""
    return time.time_ns() // 1_000_000


_last_second: tuple[int, str] = (-1, "")
"""The last whole second formatted by :func:`iso_ms` (one tuple: replaced whole, safe across threads)."""


def iso_ms(ms: int) -> str:
    """``ms`` as ISO 8601 UTC with milliseconds, e.g. ``2025-01-31T12:00:00.000Z``.

    The one timestamp format of covenant: audit records, dispatch records, logs.
    A dispatch formats several stamps within one second, so that second's
    text is kept (``strftime`` is most of the cost).
    """
    global _last_second
    seconds, millis = divmod(ms, 1000)
    last = _last_second
    if last[0] != seconds:
        last = _last_second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{last[1]}.{millis:03d}Z"


def iso_now() -> str:
    """The current time as :func:`iso_ms` formats it."""
    return iso_ms(now_ms())


def ms_from_iso(text: str) -> int:
    """The inverse of :func:`iso_ms` (also accepts ``+00:00`` offsets)."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
