"""Long-lived worker threads for spawns the event loop must not wait on.

The runner starts its long-lived processes on them (Rune replicas, stdio MCP
servers, the holders of agent uids' private /tmp): ``subprocess.Popen`` blocks
until the child has exec'd, and a holder's set-up takes ~15 ms.

Why not ``trio.to_thread``: PR_SET_PDEATHSIG fires when the *thread* that
spawned a process exits, and trio's thread cache retires a thread idle for 10 s,
so such spawns need threads that live as long as the runner.
:func:`on_a_lasting_thread` says whether the current thread is one (or the main
thread); the launcher refuses PDEATHSIG spawns anywhere else.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import trio

__all__ = ["Job", "WorkerThreads", "on_a_lasting_thread"]

T = TypeVar("T")

_lasting: set[int] = set()
"""Idents of the running :class:`WorkerThreads` threads."""


def on_a_lasting_thread() -> bool:
    """May a process that must die with covenant (PR_SET_PDEATHSIG) be spawned from this thread?

    True on the main thread and on :class:`WorkerThreads`; false on trio's thread cache, whose
    threads exit after 10 s idle and would take such a process with them.
    """
    return threading.current_thread() is threading.main_thread() or threading.get_ident() in _lasting


class Job(Generic[T]):
    """One call handed to a worker thread: :meth:`wait` for it, then take its :meth:`result`."""

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        self._call = (fn, args)
        self._token = trio.lowlevel.current_trio_token()
        self._done = trio.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    def _run(self) -> None:
        """On the worker thread."""
        fn, args = self._call
        try:
            self._value = fn(*args)
        except BaseException as exc:  # handed back to the awaiting task as is
            self._error = exc
        self._token.run_sync_soon(self._done.set)

    async def wait(self) -> None:
        """Until the call has ended. Not cancellable: a started call is always collected (a spawned
        process, a written record)."""
        with trio.CancelScope(shield=True):
            await self._done.wait()

    def result(self) -> T:
        """The call's return value, or its exception raised; only once :meth:`wait` returned."""
        if not self._done.is_set():
            raise RuntimeError("Job.result() before the call ended: await wait() first")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class WorkerThreads:
    """A fixed set of named threads that run calls in the order they were submitted."""

    def __init__(self, count: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[Job[Any] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    @classmethod
    @asynccontextmanager
    async def open(cls, count: int, name: str) -> AsyncIterator["WorkerThreads"]:
        """The threads for the body of the ``async with``; joined (off the loop) when it ends."""
        threads = cls(count, name)
        try:
            yield threads
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(threads.close)

    def _work(self) -> None:
        _lasting.add(threading.get_ident())
        try:
            while (job := self._jobs.get()) is not None:
                job._run()
        finally:
            _lasting.discard(threading.get_ident())

    def submit(self, fn: Callable[..., T], *args: Any) -> Job[T]:
        """Hand ``fn(*args)`` to a thread now (from the trio thread); await the job's ``result()``."""
        job = Job(fn, args)
        self._jobs.put(job)
        return job

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread, awaited (not cancellable, as :meth:`Job.wait`)."""
        job = self.submit(fn, *args)
        await job.wait()
        return job.result()

    def close(self) -> None:
        """Stop and join the threads (blocking) once the jobs already submitted are done."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
