"""A sliding one-minute request rate, shared by the network listeners (webhooks, A2A)."""

from __future__ import annotations

from collections import deque

__all__ = ["MinuteRate"]


class MinuteRate:
    """At most ``per_minute`` requests in any 60 s; ``over`` counts the request when it is admitted."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._accepted: deque[float] = deque()

    def over(self, now: float) -> bool:
        """True (and nothing counted) when admitting a request at ``now`` would exceed the rate."""
        while self._accepted and now - self._accepted[0] >= 60:
            self._accepted.popleft()
        if len(self._accepted) >= self.per_minute:
            return True
        self._accepted.append(now)
        return False
