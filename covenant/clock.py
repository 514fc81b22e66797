"""Milliseconds since the epoch: the one time unit of intents, grants and budgets."""

from __future__ import annotations

import time
from datetime import datetime, timezone

__all__ = ["now_ms", "iso_ms", "ms_from_iso"]


def now_ms() -> int:
    """Wall-clock time in ms since the epoch (integer: records carry no floats)."""
    return time.time_ns() // 1_000_000


def iso_ms(ms: int) -> str:
    """``ms`` as ISO 8601 UTC with milliseconds, e.g. ``2025-01-31T12:00:00.000Z``."""
    return datetime.fromtimestamp(ms // 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def ms_from_iso(text: str) -> int:
    """The inverse of :func:`iso_ms` (also accepts ``+00:00`` offsets)."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
