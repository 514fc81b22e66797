"""Rates: a sliding one-minute request rate for the network listeners (webhooks, A2A), and a token
bucket for what must not run away (an agent's stderr lines, refused connections on a replica's sockets)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

__all__ = ["MinuteRate", "TokenBucket"]


class TokenBucket:
    """``burst`` tokens at once, then ``per_s`` a second; a token is spent per thing let through."""

    def __init__(self, per_s: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s = per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._refilled_at = clock()

    def empty(self) -> bool:
        """No token to spend now."""
        self._refill()
        return self._tokens < 1

    def take(self) -> bool:
        """Spend a token if there is one (True: let this one through)."""
        if self.empty():
            return False
        self._tokens -= 1
        return True

    def wait_s(self) -> float:
        """Seconds until the next token."""
        return (1 - self._tokens) / self.per_s if self.empty() else 0.0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._refilled_at) * self.per_s)
        self._refilled_at = now


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
