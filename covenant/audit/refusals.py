"""Bound how many refused network requests reach the audit log.

A listener on the network (webhooks, A2A) audits every request, and refusals
cost the sender nothing: without a bound, anyone who can reach the port can
grow the log (and the disk) as fast as they can send. Refusals are therefore
recorded per kind up to ``per_minute`` in each minute; the ones beyond that
are counted, and the count is carried by the next refusal of that kind that
is recorded (field ``suppressed``). Accepted requests are never throttled.

Kinds must come from a bounded set (a refusal code, a configured route),
never from request text, so the table of counters cannot grow without bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["RefusalThrottle"]


@dataclass
class _Window:
    started: float
    recorded: int = 0
    suppressed: int = 0


class RefusalThrottle:
    """Decides which refusals are written to the audit log."""

    def __init__(self, per_minute: int = 60, *, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute < 1:
            raise ValueError("per_minute must be at least 1")
        self.per_minute = per_minute
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}

    def admit(self, kind: Hashable) -> int | None:
        """None: do not record this refusal. Otherwise record it with this many suppressed before it."""
        now = self._clock()
        window = self._windows.get(kind)
        if window is None or now - window.started >= 60:
            carried = window.suppressed if window is not None else 0
            window = self._windows[kind] = _Window(started=now, suppressed=carried)
        if window.recorded >= self.per_minute:
            window.suppressed += 1
            return None
        window.recorded += 1
        suppressed, window.suppressed = window.suppressed, 0
        return suppressed
