"""How many intents this host may pull now, per agent and in all (design/fleet.md §4).

An agent's pullers run while it has fewer than ``min([fleet] max_in_flight, its own
limit, [daemon] per_agent_concurrent)`` intents running here, and the daemon has a
free run slot: ``max_concurrent`` less what runs or waits there for other clients
(sampled from ``GET /v1/status`` every second). A busy host so leaves work to the
others. A puller waits for room *before* it asks NATS for a message and does not
hold a slot while it waits for one, so an idle agent never keeps another from its
share; two agents may each take the last free slot at once, and the daemon then
queues one for a moment.
"""

from __future__ import annotations

import asyncio
from collections import Counter

__all__ = ["Capacity", "agent_limit"]


def agent_limit(max_in_flight: int, own_limit: int | None, per_agent: int, max_concurrent: int) -> int:
    """The most intents of one agent this host runs at once (``per_agent`` 0 means no daemon limit per agent)."""
    limits = [max_in_flight, max_concurrent]
    if own_limit:
        limits.append(own_limit)
    if per_agent:
        limits.append(per_agent)
    return max(0, min(limits))


class Capacity:
    """Running counts and limits; pullers wait in :meth:`wait_room`, deliveries :meth:`take` and :meth:`release`."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._limits: dict[str, int] = {}
        self._running: Counter[str] = Counter()
        self._host_free = 0
        """Run slots of the daemon this host's fleet may use: max_concurrent less what other clients run or queue."""
        self.closed = False

    @property
    def running(self) -> int:
        return sum(self._running.values())

    def running_for(self, agent_id: str) -> int:
        return self._running[agent_id]

    def limit_for(self, agent_id: str) -> int:
        return self._limits.get(agent_id, 0)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def set_limits(self, limits: dict[str, int]) -> None:
        self._limits = dict(limits)
        await self._notify()

    async def set_daemon(self, max_concurrent: int, busy: int) -> None:
        """From the daemon's status: its slots, and how many of them run or wait (ours included)."""
        others = max(0, busy - self.running)
        self._host_free = max(0, max_concurrent - others)
        await self._notify()

    async def daemon_gone(self) -> None:
        """The daemon does not answer: pull nothing until it does."""
        self._host_free = 0
        await self._notify()

    def _has_room(self, agent_id: str) -> bool:
        return (not self.closed and self._running[agent_id] < self._limits.get(agent_id, 0)
                and self.running < self._host_free)

    async def wait_room(self, agent_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` s until ``agent_id`` may pull one more; False when it may not (yet, or closed)."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.closed or self._has_room(agent_id)), timeout)
            except TimeoutError:
                return False
            return self._has_room(agent_id)

    def take(self, agent_id: str) -> None:
        self._running[agent_id] += 1

    async def release(self, agent_id: str) -> None:
        self._running[agent_id] -= 1
        if self._running[agent_id] <= 0:
            del self._running[agent_id]
        await self._notify()

    async def close(self) -> None:
        """Draining: no puller gets room again."""
        self.closed = True
        await self._notify()
