"""The daemon's schedule runner: fires each ``[[schedules]]`` entry as a daemon-signed intent.

First fire: one period after start (``every``) or the next cron time. With a
persisted last slot, the next slot follows it; a slot that fell while the
daemon was down runs once at start with ``catch_up = true``, otherwise it is
audited as ``schedule.skipped``. Each firing is audited as ``schedule.fire``
(after its slot is persisted, before its dispatch), then dispatched through
``Daemon.dispatch``: the issuer's grants decide it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from covenant.clock import now_ms
from covenant.errors import ConfigProblems, CovenantError
from covenant.triggers.agent_schedules import AgentScheduleStore
from covenant.triggers.config import ScheduleConfig
from covenant.triggers.onbehalf import OnBehalfSigner, issuer_pubkey
from covenant.triggers.state import ScheduleState
from covenant.triggers.timing import next_after

__all__ = ["ScheduleRunner", "resolve_issuers", "missed_slots"]

log = logging.getLogger("covenant.daemon")

_POLL_MS = 1000
"""How often the runner looks for schedules agents created or deleted."""


class _Daemon(Protocol):
    shutting_down: bool

    async def dispatch(self, body: dict[str, Any], *, daemon_signer: str | None = None) -> dict[str, Any]: ...


class _Audit(Protocol):
    async def record(self, type_: str, data: dict[str, Any]) -> Any: ...


def resolve_issuers(schedules: tuple[ScheduleConfig, ...], known: dict[str, str]) -> dict[str, str]:
    """schedule name -> issuer pubkey; ConfigError naming every schedule whose issuer is not known."""
    issuers, problems = {}, ConfigProblems()
    for schedule in schedules:
        with problems.gathered():
            issuers[schedule.name] = issuer_pubkey(known, schedule.issuer, where=f"[[schedules]] {schedule.name!r}",
                                                   field=f"schedules.{schedule.name}.issuer")
    problems.raise_any()
    return issuers


@dataclass
class _Plan:
    schedule: ScheduleConfig
    pubkey: str
    next_ms: int
    last_ms: int | None = None
    last_intent: str | None = None


class ScheduleRunner:
    """Runs in the daemon's nursery until cancelled."""

    def __init__(self, schedules: tuple[ScheduleConfig, ...], issuers: dict[str, str], state: ScheduleState,
                 signer: OnBehalfSigner, audit: _Audit, daemon: _Daemon,
                 agent_store: AgentScheduleStore | None = None) -> None:
        self.schedules = schedules
        self.agent_store = agent_store
        self._agent_stamp: tuple[int, int] | None = None
        self._agent_names: set[str] = set()
        self.issuers = issuers
        self.state = state
        self.signer = signer
        self.audit = audit
        self.daemon = daemon
        self.plans: dict[str, _Plan] = {}
        self._planning = trio.Lock()
        """Held while the schedules are planned: at start, and by :meth:`replace`."""
        self._planned = False

    def view(self) -> list[dict[str, Any]]:
        """Each schedule with its next and last runs (``covenant schedules``)."""
        return [
            {"name": p.schedule.name, "agent": p.schedule.agent, "issuer": p.schedule.issuer,
             "every": p.schedule.every, "cron": p.schedule.cron, "catch_up": p.schedule.catch_up,
             "next_ms": p.next_ms, "last_ms": p.last_ms, "last_intent": p.last_intent}
            for p in self.plans.values()
        ]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        due_now: list[_Plan] = []
        async with self._planning:
            await trio.to_thread.run_sync(self.state.load)
            start = now_ms()
            for schedule in self.schedules:
                await self._add(_Plan(schedule, self.issuers[schedule.name], 0), start, due_now)
            await self._sync_agent_schedules(start, due_now)
            self._planned = True
        async with trio.open_nursery() as nursery:
            task_status.started()
            for missed in due_now:
                await self._fire(nursery, self.plans[missed.schedule.name], missed.next_ms, catch_up=True)
            while True:
                soonest = min(self.plans.values(), key=lambda p: p.next_ms, default=None)
                wake = now_ms() + _POLL_MS if soonest is None else min(soonest.next_ms, now_ms() + _POLL_MS)
                await trio.sleep(max(0, wake - now_ms()) / 1000)
                if self.daemon.shutting_down:
                    await trio.sleep_forever()
                await self._sync_agent_schedules(now_ms(), None)
                if soonest is None or self.plans.get(soonest.schedule.name) is not soonest or soonest.next_ms > now_ms():
                    continue
                slot = soonest.next_ms
                soonest.next_ms = next_after(soonest.schedule, max(slot, now_ms()) if soonest.schedule.cron else slot)
                await self._fire(nursery, soonest, slot, catch_up=False)

    async def replace(self, schedules: tuple[ScheduleConfig, ...], issuers: dict[str, str]) -> None:
        """Take a reloaded ``[[schedules]]`` (``issuers``: name -> public key, :func:`resolve_issuers`).

        A schedule that is new, or whose table or issuer key changed, is planned from its persisted last
        slot, never firing for a slot missed before now; an unchanged one keeps its plan; a removed one
        fires no more (a firing under way goes on). The loop sees the change within a second.
        """
        async with self._planning:
            before = {s.name: (s, self.issuers[s.name]) for s in self.schedules}
            self.schedules, self.issuers = schedules, issuers
            if not self._planned:
                return  # run() plans what is current when it starts
            for name in before.keys() - issuers.keys():
                self.plans.pop(name, None)
            now = now_ms()
            for schedule in schedules:
                if before.get(schedule.name) != (schedule, issuers[schedule.name]):
                    await self._add(_Plan(schedule, issuers[schedule.name], 0), now, None)
            # An agent-made schedule may now be shadowed by a configured one of its name, or freed by its removal.
            self._agent_names -= issuers.keys()
            self._agent_stamp = None

    async def _add(self, plan: _Plan, start: int, due_now: list[_Plan] | None) -> None:
        """Plan a schedule's next slot from its persisted last one (start-up: handle a missed slot)."""
        schedule = plan.schedule
        last = self.state.last_slot(schedule.name)
        plan.last_ms, plan.last_intent = last, self.state.entries.get(schedule.name, {}).get("last_intent")
        plan.next_ms = next_after(schedule, start if last is None else last)
        if last is not None and plan.next_ms <= start:
            missed = plan.next_ms
            through, slots = missed_slots(schedule, missed, start)
            plan.next_ms = next_after(schedule, start)
            if due_now is None:  # created while running, under the name of an older one: it counts from now
                pass
            elif schedule.catch_up:
                due_now.append(_Plan(schedule, plan.pubkey, missed))
            else:
                await trio.to_thread.run_sync(lambda: self.state.save(schedule.name, last_slot_ms=through, skipped=True))
                await self.audit.record("schedule.skipped", {"schedule": schedule.name, "slot_ms": missed,
                                                             "through_ms": through, "slots": slots,
                                                             "reason": "daemon_down", "catch_up": False})
        self.plans[schedule.name] = plan

    async def _sync_agent_schedules(self, now: int, due_now: list[_Plan] | None) -> None:
        """Pick up schedules agents created or deleted (``rune@schedule-*``) since the last look."""
        if self.agent_store is None:
            return
        stamp = await trio.to_thread.run_sync(self.agent_store.stamp)
        if stamp == self._agent_stamp:
            return
        self._agent_stamp = stamp
        current = {s.name: (s, pubkey) for s, pubkey in await trio.to_thread.run_sync(self.agent_store.schedules)
                   if s.name not in self.issuers}
        for gone in self._agent_names - current.keys():
            self.plans.pop(gone, None)
        for name, (schedule, pubkey) in current.items():
            if name not in self._agent_names:
                await self._add(_Plan(schedule, pubkey, 0), now, due_now)
        self._agent_names = set(current)

    async def _fire(self, nursery: trio.Nursery, plan: _Plan, slot: int, *, catch_up: bool) -> None:
        schedule = plan.schedule
        body = self.signer.body(schedule.input, agent=schedule.agent, issuer_display=schedule.issuer,
                                issuer_pubkey=plan.pubkey, now_ms=now_ms())
        intent_id = body["intent"]["id"]
        with trio.CancelScope(shield=True):  # a stop signal never separates the persisted slot from its record
            await trio.to_thread.run_sync(lambda: self.state.save(schedule.name, last_slot_ms=slot, last_intent=intent_id))
            plan.last_ms, plan.last_intent = slot, intent_id
            await self.audit.record("schedule.fire", {
                "schedule": schedule.name, "slot_ms": slot, "intent": intent_id, "agent": schedule.agent,
                "issuer": plan.pubkey, "issuer_display": schedule.issuer, "catch_up": catch_up,
            })
        nursery.start_soon(self._dispatch, schedule.name, body)

    async def _dispatch(self, name: str, body: dict[str, Any]) -> None:
        try:
            document = await self.signer.dispatch(self.daemon, body)
        except CovenantError as exc:  # already audited by the dispatch (policy.decision / intent.completed)
            log.warning("schedule firing refused", extra={"schedule": name, "intent": body["intent"]["id"],
                                                          "outcome": exc.code})
            return
        log.info("schedule fired", extra={"schedule": name, "intent": document["intent_id"],
                                          "outcome": document.get("outcome")})


_MAX_COUNTED_SLOTS = 1_000_000


def missed_slots(schedule: ScheduleConfig, first: int, now: int) -> tuple[int, int]:
    """(the last slot at or before ``now``, how many slots from ``first`` to it): what one
    ``schedule.skipped`` event stands for. Counting stops at a million slots (a 1 s period down for
    eleven days); the last slot is then the millionth."""
    last, count = first, 1
    while count < _MAX_COUNTED_SLOTS:
        following = next_after(schedule, last)
        if following > now:
            break
        last, count = following, count + 1
    return last, count
