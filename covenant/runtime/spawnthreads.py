"""Long-lived threads that start agent processes while the event loop works on.

``subprocess.Popen`` blocks its caller until the child has exec'd (vfork),
and on a busy box the child may wait milliseconds for a CPU; making a scratch
dir can wait as long on a journaling filesystem. When other dispatches are in
flight the runner does that work here, so the loop keeps serving them.

The threads are the runner's own and live until it closes: PR_SET_PDEATHSIG
fires when the *thread* that spawned the agent exits, so trio's thread cache
(which retires idle threads) must not spawn agents.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import trio

__all__ = ["SpawnThreads"]

T = TypeVar("T")


class SpawnThreads:
    """A fixed set of worker threads; :meth:`run` awaits one call on them."""

    def __init__(self, count: int) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"covenant-spawn-{i}", daemon=True) for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a spawn thread. Not cancellable: a started spawn is always collected."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[Any] = []

        def job() -> None:
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # handed back to the caller as is
                box.append((False, exc))
            token.run_sync_soon(done.set)

        self._jobs.put(job)
        with trio.CancelScope(shield=True):
            await done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stop and join the threads (blocking); call when no agent is left."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
