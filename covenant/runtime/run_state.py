"""The state of one in-flight run: shared by the runner's tasks and the sampler.

The first limit crossed decides the outcome (:meth:`RunState.decide`);
later ones only wake the run again.
"""

from __future__ import annotations

from typing import Any

import trio

from covenant.manifest.model import AgentSpec
from covenant.runtime.disk_use import DiskUse
from covenant.runtime.launcher import Launched
from covenant.runtime.outcome import Outcome
from covenant.runtime.sampler import ProcessTree

__all__ = ["RunState"]


class RunState:
    """The state of one in-flight run, shared by its tasks and the sampler."""

    def __init__(
        self,
        agent: AgentSpec,
        intent_id: str,
        launched: Launched,
        limits: dict[str, Any],
        wall_s: float,
        cpu_ms: int,
        caller_deadline: float | None = None,
    ) -> None:
        self.agent = agent
        self.intent_id = intent_id
        self.launched = launched
        self.limits = limits
        self.tree = ProcessTree(launched.pid, intent_id)
        self.wall_s = wall_s
        self.deadline = trio.current_time() + wall_s
        self.caller_deadline = caller_deadline
        """Trio time by which the run must end whatever its own budget: a child intent's caller's end."""
        self.cpu_budget_ms = cpu_ms
        self.memory_kib = limits["memory_mb"] * 1024  # a Rune agent's: its class's (LaunchPlans.limits)
        self.disk: DiskUse | None = None
        """What the run holds on disk, against its ``disk_mb``; set by the runner once its scratch dir is known."""
        self.verdict: Outcome | None = None
        self.error: str | None = None
        self.notes: list[str] = []
        self.interrupt: trio.CancelScope | None = None
        """Set while the run's task waits for its end; :meth:`decide` cancels it to wake that task."""
        self.stdout = bytearray()
        self.stdout_bytes = 0
        self._stdout_moved = trio.Event()
        self.stderr_tail = bytearray()
        self.stderr_unlogged_bytes = 0
        """stderr over the run's log budget: counted, not logged (set when its watch closes)."""
        self.swept = False
        """The kill ladder finished and found no survivor."""
        self.left_behind = 0
        """Processes of the run found alive after its agent's own process had ended, and killed."""
        self.hook_error: Exception | None = None
        self.keep_stdin_open = False
        """Leave stdin open after the first document (``rune@process-write`` feeds it later)."""

    def stdout_moved(self) -> None:
        """The run's watch took more of its stdout, or saw it end: wake :meth:`wait_stdout`'s waiters."""
        self._stdout_moved.set()
        self._stdout_moved = trio.Event()

    async def wait_stdout(self) -> None:
        """Return once more stdout has arrived or stdout has ended (for a tool that answers line by line)."""
        await self._stdout_moved.wait()

    def decide(self, outcome: Outcome, error: str) -> None:
        """Record the first limit crossed (later ones do not change the outcome) and wake the run."""
        if self.verdict is None:
            self.verdict = outcome
            self.error = error
        if self.interrupt is not None:
            self.interrupt.cancel()

    def check_limits(self) -> None:
        """Called by the sampler after each tick."""
        if self.verdict is not None:
            return
        tree = self.tree
        if tree.cpu_ms > self.cpu_budget_ms:
            self.decide(
                "cpu_exceeded",
                f"the agent's process tree used {tree.cpu_ms} ms of CPU time, "
                f"over cpu_ms_per_task = {self.cpu_budget_ms} ms",
            )
        elif tree.rss_kib > self.memory_kib and (own_kib := tree.own_resident_kib()) > self.memory_kib:
            self.decide(
                "memory_exceeded",
                f"the agent's process tree reached {own_kib // 1024} MiB resident memory of its own "
                f"(anonymous and shared memory), over memory_mb = {self.memory_kib // 1024}",
            )
        else:
            self.check_disk()

    def check_disk(self, *, at_end: bool = False) -> None:
        """Decide ``disk_exceeded`` when the run's disk use is over ``disk_mb`` (or cannot be measured);
        ``at_end``: the last check, once its processes are gone (:meth:`DiskUse.over`)."""
        if self.verdict is None and self.disk is not None and (why := self.disk.over(at_end=at_end)) is not None:
            self.decide("disk_exceeded", why)
