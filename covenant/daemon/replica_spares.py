"""Warm spare replicas (``[rune] warm = 1``): a replica process started ahead, waiting for its spec.

Most of a replica's cold start is its interpreter importing trio, h11 and the
Rune loop (``python -X importtime``); binding its socket once the spec
arrives takes a few milliseconds. So a spare is a replica process launched
exactly as a life of the agent's replica would be (same plan: uid, rlimits,
environment, network namespace), let through its exec gate, and left blocked
on its stdin before the spec line: imported, but serving nothing and
reachable by nobody. The next life of that agent's replica (after a crash,
``covenant restart``, or a reload that replaced the package) takes it over and
writes the spec, instead of launching a process and waiting for its imports.

One spare per agent at most, started once that agent's replica is ready (so
it never competes with the start it is meant to speed up). A spare holds a
resident claim on its agent's uid of its own until a life takes it (whose own
claim then covers it) or it is stopped: when the agent's replica stops for
good (idle stop, agent removed, daemon stop) or its plan no longer matches
the one a new life wants (a changed ``resource_profile``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from covenant.manifest.model import AgentSpec
from covenant.runtime.launcher import AgentCredentials, Launched, LaunchError, LaunchPlan
from covenant.runtime.pdeathsig import GATE_BYTE
from covenant.runtime.runner import Runner

__all__ = ["SpareReplicas", "PlanFor"]

log = logging.getLogger("covenant.rune")

PlanFor = Callable[[AgentCredentials | None], LaunchPlan]
"""The launch plan of one of an agent's replica processes, for the uid it runs as."""

_KILL_GRACE_S = 2.0


@dataclass
class _Spare:
    plan: LaunchPlan
    launched: Launched
    taken: bool = False


class SpareReplicas:
    """The warm spares of one daemon's replicas; run :meth:`run` in a nursery for the daemon's lifetime."""

    def __init__(self, runner: Runner, *, warm: int) -> None:
        self.runner = runner
        self.warm = warm
        self._spares: dict[str, _Spare] = {}
        """The spares launched and waiting."""
        self._keeping: dict[str, trio.CancelScope] = {}
        """Each agent's spare task, from before its launch until its spare is taken or stopped."""
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the spares' tasks; on cancellation every spare is stopped and its uid claim given back."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    def pid(self, agent_id: str) -> int | None:
        """The pid of the agent's spare waiting now, or None."""
        spare = self._spares.get(agent_id)
        return spare.launched.pid if spare is not None else None

    def fill_soon(self, agent: AgentSpec, plan_for: PlanFor) -> None:
        """Start a spare for ``agent`` in the background unless one waits or is starting (or warm = 0)."""
        if self.warm < 1 or self._nursery is None or agent.id in self._keeping:
            return
        scope = self._keeping[agent.id] = trio.CancelScope()
        self._nursery.start_soon(self._keep, agent, plan_for, scope)

    def take(self, agent_id: str, plan: LaunchPlan) -> Launched | None:
        """The agent's spare process, handed over to the caller (who writes its spec line and stops it in
        the end), when one waits, is alive and was launched with ``plan``; otherwise None (a spare that
        does not fit is stopped)."""
        spare = self._spares.pop(agent_id, None)
        if spare is None:
            return None
        if spare.plan != plan or spare.launched.exited_now():
            log.info("warm spare replica dropped", extra={"agent": agent_id, "pid": spare.launched.pid,
                                                          "reason": "exited" if spare.plan == plan else "plan changed"})
            self.discard(agent_id)
            return None
        spare.taken = True
        self.discard(agent_id)
        return spare.launched

    def discard(self, agent_id: str) -> None:
        """Stop the agent's spare, waiting or still starting (its replica stopped for good); a taken one is
        only let go of."""
        self._spares.pop(agent_id, None)
        scope = self._keeping.pop(agent_id, None)
        if scope is not None:
            scope.cancel()

    async def _keep(self, agent: AgentSpec, plan_for: PlanFor, scope: trio.CancelScope) -> None:
        """Launch one spare and hold it until it is taken, dropped or exits, or the daemon stops."""
        creds: AgentCredentials | None = None
        claimed = False
        spare: _Spare | None = None
        try:
            with scope:
                creds = await self.runner.uids.claim(agent.id, resident=True)
                claimed = True
                plan = plan_for(creds)
                try:
                    launched = await self.runner.launch(plan, agent, "off")  # not cancellable: never lost
                except (LaunchError, OSError) as exc:
                    log.warning("warm spare replica could not start", extra={"agent": agent.id, "error": str(exc)})
                    return
                spare = _Spare(plan, launched)
                if launched.gated:
                    try:
                        await launched.stdin.send_all(GATE_BYTE)  # it may exec and import; the spec comes when taken
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # it died already: the wait below ends at once
                self._spares[agent.id] = spare
                log.info("warm spare replica started", extra={"agent": agent.id, "pid": launched.pid})
                await launched.wait_exit()
                log.warning("warm spare replica exited while waiting", extra={"agent": agent.id, "pid": launched.pid})
        except Exception:  # a spare is an optimisation: its failure must cost nothing but itself
            log.exception("warm spare replica failed", extra={"agent": agent.id})
        finally:
            if self._keeping.get(agent.id) is scope:
                del self._keeping[agent.id]
            if spare is not None and self._spares.get(agent.id) is spare:
                del self._spares[agent.id]
            with trio.CancelScope(shield=True):
                if spare is not None and not spare.taken:
                    await spare.launched.stop(_KILL_GRACE_S)
                if claimed:
                    await self.runner.uids.release(creds, agent.id, f"replica-spare:{agent.id}", resident=True)
