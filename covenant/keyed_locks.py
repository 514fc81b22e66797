"""One trio lock per key (a session, an agent's session), kept only while someone holds or waits for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager

import trio

__all__ = ["KeyedLocks"]


class KeyedLocks:
    """``async with locks.hold(key):`` runs one task at a time per key; idle keys cost nothing."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, trio.Lock] = {}

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock = self._locks.setdefault(key, trio.Lock())
        try:
            async with lock:
                yield
        finally:
            # Released to a waiter, the lock is still held (trio hands it over): keep it then.
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._locks.pop(key, None)
