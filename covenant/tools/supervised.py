"""Supervised processes of ``rune@process-*``: started for an intent, gone when it ends.

Each process is a run of the runner's tool mode (the agent's uid, its
limits, its workspace as cwd and, where the host confines tool files, the
only place it writes besides its scratch dir; the agents' environment) whose stdin stays
open, whose output is handed out by polls, and whose wall-clock budget is
what the intent has left. The registry is the daemon's, per agent; a
process is stopped through the runner's kill ladder when the model kills it,
when its intent ends (:meth:`ProcessRegistry.intent_ended`) or when the
daemon stops. At most ``[tools.process] max_per_agent`` per agent, finished
ones counting until they are polled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import trio

from covenant.config import AgentNetwork, ProcessToolConfig
from covenant.manifest.model import AgentSpec
from covenant.runtime.run_state import RunState
from covenant.runtime.runner import Runner
from covenant.runtime.tool_files import ToolFiles
from covenant.runtime.toolrun import ToolRun
from covenant.tools.result import ToolError

__all__ = ["ProcessRegistry", "Supervised"]


@dataclass
class Supervised:
    """One process as the model knows it."""

    id: str
    agent_id: str
    intent_id: str
    command: str
    started_ms: int
    state: RunState | None = None
    record: ToolRun | None = None
    started: trio.Event = field(default_factory=trio.Event)
    ended: trio.Event = field(default_factory=trio.Event)

    @property
    def running(self) -> bool:
        return self.record is None

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "command": self.command[:200], "running": self.running}
        if self.record is not None:
            out.update(outcome=_outcome(self.record), exit_code=self.record.exit_code, signal=self.record.signal)
        return out


def _outcome(record: ToolRun) -> str:
    """``exited`` for a process that ended by itself (any exit code), else the runner's reason."""
    if record.outcome in ("ok", "no_result", "protocol_error") or (record.outcome == "crashed" and record.signal is None):
        return "exited"
    return record.outcome


def _take(buffer: bytearray, limit: int) -> tuple[str, bool]:
    """The first ``limit`` bytes of ``buffer``, removed from it; True when more is left."""
    chunk = bytes(buffer[:limit])
    del buffer[:limit]
    return chunk.decode("utf-8", "replace"), bool(buffer)


class ProcessRegistry:
    """Every supervised process of the daemon, by agent."""

    def __init__(self, runner: Runner, config: ProcessToolConfig, network: AgentNetwork) -> None:
        self.runner = runner
        self.config = config
        self.network = network
        """``[tools.shell] network``: what the processes may reach."""
        self._by_agent: dict[str, dict[str, Supervised]] = {}
        self._started = 0

    def set_limits(self, config: ProcessToolConfig, network: AgentNetwork) -> None:
        """Take a reloaded ``[tools.process]`` and ``[tools.shell] network`` for the processes started from now on."""
        self.config, self.network = config, network

    def _of(self, agent_id: str, process_id: str) -> Supervised:
        process = self._by_agent.get(agent_id, {}).get(process_id)
        if process is None:
            raise ToolError("process_not_found", f"no process {process_id!r} of this agent (see process-list)")
        return process

    async def start(
        self, agent: AgentSpec, intent_id: str, command: str, cwd: str, wall_ms: int, shell: str, priority: str
    ) -> Supervised:
        """Start ``command`` and return once it runs (or failed to start)."""
        mine = self._by_agent.setdefault(agent.id, {})
        if len(mine) >= self.config.max_per_agent:
            raise ToolError(
                "process_limit",
                f"this agent has {len(mine)} processes (running, or finished and not polled yet), the most "
                f"[tools.process] max_per_agent allows; kill or poll one first",
            )
        self._started += 1
        process = Supervised(
            id=f"p-{self._started}", agent_id=agent.id, intent_id=intent_id, command=command,
            started_ms=int(time.time() * 1000),
        )
        mine[process.id] = process

        def on_started(state: RunState) -> None:
            state.keep_stdin_open = True
            process.state = state
            process.started.set()

        async def supervise() -> None:
            try:
                process.record = await self.runner.run_tool(
                    agent, (shell, "-c", command), b"", run_id=f"{intent_id}:process:{process.id}",
                    wall_ms=wall_ms, network=self.network, cwd=cwd, on_started=on_started,
                    files=self.runner.tool_confinement.where_possible(ToolFiles(read_write=(cwd,))), priority=priority,
                )
            finally:
                if process.record is None:
                    process.record = ToolRun.spawn_failed([shell, "-c", command], "the daemon stopped", time.monotonic())
                process.started.set()
                process.ended.set()

        trio.lowlevel.spawn_system_task(supervise, name=f"covenant-process-{process.id}")
        await process.started.wait()
        if process.state is None and process.record is not None:
            del mine[process.id]
            raise ToolError("tool_unavailable", f"the process could not be started: {process.record.error}")
        return process

    async def poll(self, agent_id: str, process_id: str, wait_ms: int = 0) -> dict[str, Any]:
        """New output since the last poll, after waiting up to ``wait_ms`` for the process to end.

        A finished process is forgotten once its output is all out.
        """
        process = self._of(agent_id, process_id)
        if wait_ms > 0:
            with trio.move_on_after(wait_ms / 1000):
                await process.ended.wait()
        limit = self.config.output_max_bytes
        out = process.view()
        state = process.state
        if state is None:
            out.update(stdout="", stderr="", more=False)
            self._by_agent[agent_id].pop(process_id, None)
            return out
        stdout, more_out = _take(state.stdout, limit)
        stderr, more_err = _take(state.stderr_tail, limit)
        out.update(stdout=stdout, stderr=stderr, more=more_out or more_err)
        if process.record is not None:
            if process.record.error and out["outcome"] != "exited":
                out["error"] = process.record.error
            if not out["more"]:
                self._by_agent[agent_id].pop(process_id, None)
        return out

    async def write(self, agent_id: str, process_id: str, data: str, close: bool) -> dict[str, Any]:
        process = self._of(agent_id, process_id)
        if not process.running or process.state is None:
            raise ToolError("tool_failed", f"process {process_id} has ended; nothing can be written to it")
        stream = process.state.launched.stdin
        raw = data.encode("utf-8", "surrogatepass")
        try:
            if raw:
                await stream.send_all(raw)
            if close:
                await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise ToolError("tool_failed", f"process {process_id} does not read its stdin any more: {exc}") from None
        return {"id": process_id, "written": len(raw), "closed": close}

    async def kill(self, agent_id: str, process_id: str) -> dict[str, Any]:
        """Stop it through the kill ladder and wait until its whole tree is gone."""
        process = self._of(agent_id, process_id)
        if process.state is not None:
            process.state.decide("cancelled", "stopped by process-kill")
        await process.ended.wait()
        self._by_agent[agent_id].pop(process_id, None)
        return process.view()

    def list(self, agent_id: str) -> dict[str, Any]:
        return {"processes": [p.view() for p in self._by_agent.get(agent_id, {}).values()]}

    async def intent_ended(self, intent_id: str) -> None:
        """Stop every process started for ``intent_id`` and forget them (shield the call)."""
        ending = [p for procs in self._by_agent.values() for p in procs.values() if p.intent_id == intent_id]
        for process in ending:
            if process.state is not None:
                process.state.decide("cancelled", "its intent ended")
        for process in ending:
            await process.ended.wait()
            self._by_agent.get(process.agent_id, {}).pop(process.id, None)
