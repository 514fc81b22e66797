"""Watch one run from one task: its stdout, its stderr and its root's exit through one epoll set.

A run has three things to wait on: two pipes and the root's pidfd. Three
trio tasks (one per stream, one per pidfd) cost a scheduler pass and an
epoll registration each, per read, on every dispatch. Here the three fds sit
in one private epoll set, and the run's task waits on that set's own fd
with :func:`trio.lowlevel.wait_readable`: one registration, one wake-up for
whatever is ready. Each wake-up reads at most one chunk per pipe, then
waits again, so an agent that never stops writing cannot hold the loop.
"""

from __future__ import annotations

import contextlib
import os
import select

import trio

from covenant.config import RuntimeConfig
from covenant.runtime.contract import preview
from covenant.runtime.run_state import RunState
from covenant.runtime.stderr_lines import StderrLines

__all__ = ["RunWatch"]

_CHUNK = 65536


class RunWatch:
    """Reads a run's output and notices its root's exit; one per run, closed by its owner.

    What it reads goes into the :class:`RunState`: ``stdout`` up to
    ``stdout_cap`` bytes (more decides ``output_too_large``), the last
    stderr bytes, and each stderr line to the ``covenant.agent`` log.
    """

    def __init__(self, d: RunState, runtime: RuntimeConfig) -> None:
        self._run = d
        self._stdout_cap = runtime.stdout_cap_bytes
        self._stderr_keep = runtime.stderr_tail_bytes
        self._lines = StderrLines.within(runtime, "agent stderr", {"agent": d.agent.id, "intent": d.intent_id})
        self._stderr_paused = False
        """Over its log budget: stderr is out of the epoll set until :meth:`StderrLines.pause_s` has passed."""
        launched = d.launched
        self._stdout_fd = launched.stdout.fileno()
        self._stderr_fd = launched.stderr.fileno()
        self._pidfd = launched.pidfd
        self._open = {self._stdout_fd: launched.stdout, self._stderr_fd: launched.stderr}
        """The pipes not at their end yet."""
        self.root_exited = False
        """The root has exited (it may not be reaped yet)."""
        self._epoll = select.epoll(3)
        for fd in (self._stdout_fd, self._stderr_fd, self._pidfd):
            self._epoll.register(fd, select.EPOLLIN)

    def close(self) -> None:
        """Log a last unended stderr line and close the epoll set.

        The pipes and the pidfd belong to :class:`~covenant.runtime.launcher.Launched`.
        """
        self._lines.flush()
        self._run.stderr_unlogged_bytes = self._lines.dropped_bytes
        self._epoll.close()

    async def until_exit_or_decided(self, deadline: float) -> None:
        """Read output until the root exits, the run is decided (:meth:`RunState.decide`) or ``deadline``."""
        d = self._run
        with trio.CancelScope(deadline=deadline) as scope:
            d.interrupt = scope
            try:
                while d.verdict is None and not self.root_exited:
                    await self._next()
            finally:
                d.interrupt = None

    async def await_root(self, timeout: float) -> bool:
        """Read output until the root exits (True) or ``timeout`` seconds pass (False): the kill ladder's wait."""
        with trio.move_on_after(timeout):
            while not self.root_exited:
                await self._next()
        return self.root_exited or self._run.launched.exited_now()

    async def drain(self, timeout: float) -> None:
        """Read what is still buffered until both pipes end, for at most ``timeout`` seconds."""
        with trio.move_on_after(timeout):
            while self._open:
                await self._next()

    async def _next(self) -> None:
        pause = self._pace_stderr()
        with trio.move_on_after(pause) if pause else contextlib.nullcontext():
            await trio.lowlevel.wait_readable(self._epoll.fileno())
        for fd, _events in self._epoll.poll(0):
            if fd == self._pidfd:
                self._epoll.unregister(fd)  # readable from now on: level-triggered, it would spin
                self.root_exited = True
                continue
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue  # nothing there after all
            except OSError:
                data = b""
            if not data:
                self._end(fd)
            elif fd == self._stdout_fd:
                self._take_stdout(data)
            else:
                self._take_stderr(data)

    def _pace_stderr(self) -> float:
        """Take stderr out of the epoll set while its log budget is spent (its writer waits on the full
        pipe), put it back once a line may be logged; the seconds until then, or 0."""
        if self._stderr_fd not in self._open:
            return 0.0
        pause = self._lines.pause_s()
        if pause and not self._stderr_paused:
            self._epoll.unregister(self._stderr_fd)
        elif not pause and self._stderr_paused:
            self._epoll.register(self._stderr_fd, select.EPOLLIN)
        self._stderr_paused = bool(pause)
        return pause

    def _end(self, fd: int) -> None:
        """A pipe is done: stop watching it, close our end, and log stderr's unended last line."""
        self._epoll.unregister(fd)
        self._open.pop(fd).close()
        if fd == self._stderr_fd:
            self._lines.flush()
        else:
            self._run.stdout_moved()

    def _take_stdout(self, data: bytes) -> None:
        d = self._run
        if not d.stdout_bytes:
            # The agent is answering and still alive: read its memory
            # high-water mark now, so a run shorter than one tick has a peak.
            d.tree.note_root_hwm()
        d.stdout_bytes += len(data)
        cap = self._stdout_cap
        if len(d.stdout) + len(data) > cap:
            d.stdout += data[: cap - len(d.stdout)]
            d.decide(
                "output_too_large",
                f"the agent wrote more than runtime.stdout_cap_bytes = {cap} bytes on stdout; "
                f"first bytes: {preview(bytes(d.stdout))}",
            )
            self._end(self._stdout_fd)  # closing the pipe makes further writes fail
            return
        d.stdout += data
        d.stdout_moved()

    def _take_stderr(self, data: bytes) -> None:
        """Keep the tail and log each line; a full pipe must never block the agent."""
        d = self._run
        keep = self._stderr_keep
        d.stderr_tail += data
        if len(d.stderr_tail) > 2 * keep:
            del d.stderr_tail[:-keep]
        self._lines.feed(data)
