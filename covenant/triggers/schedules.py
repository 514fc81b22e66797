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
from covenant.errors import ConfigError, CovenantError
from covenant.triggers.config import ScheduleConfig
from covenant.triggers.onbehalf import OnBehalfSigner
from covenant.triggers.state import ScheduleState
from covenant.triggers.timing import next_after

__all__ = ["ScheduleRunner", "resolve_issuers"]

log = logging.getLogger("covenant.daemon")


class _Daemon(Protocol):
    shutting_down: bool

    async def dispatch(self, body: dict[str, Any], *, daemon_signer: str | None = None) -> dict[str, Any]: ...


class _Audit(Protocol):
    async def record(self, type_: str, data: dict[str, Any]) -> Any: ...


def resolve_issuers(schedules: tuple[ScheduleConfig, ...], known: dict[str, str]) -> dict[str, str]:
    """schedule name -> issuer pubkey; ConfigError naming the schedule when its issuer is not known."""
    resolved = {}
    for schedule in schedules:
        pubkey = known.get(schedule.issuer)
        if pubkey is None:
            raise ConfigError(
                f"[[schedules]] {schedule.name!r}: issuer {schedule.issuer!r} is not a display name in "
                "identities.toml (record it with `covenant identity add NAME PUBKEY`)",
                field=f"schedules.{schedule.name}.issuer",
            )
        resolved[schedule.name] = pubkey
    return resolved


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
                 signer: OnBehalfSigner, audit: _Audit, daemon: _Daemon) -> None:
        self.schedules = schedules
        self.issuers = issuers
        self.state = state
        self.signer = signer
        self.audit = audit
        self.daemon = daemon
        self.plans: dict[str, _Plan] = {}

    def view(self) -> list[dict[str, Any]]:
        """Each schedule with its next and last runs (``covenant schedules``)."""
        return [
            {"name": p.schedule.name, "agent": p.schedule.agent, "issuer": p.schedule.issuer,
             "every": p.schedule.every, "cron": p.schedule.cron, "catch_up": p.schedule.catch_up,
             "next_ms": p.next_ms, "last_ms": p.last_ms, "last_intent": p.last_intent}
            for p in self.plans.values()
        ]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self.state.load)
        start = now_ms()
        due_now: list[_Plan] = []
        for schedule in self.schedules:
            last = self.state.last_slot(schedule.name)
            entry = self.state.entries.get(schedule.name, {})
            plan = _Plan(schedule, self.issuers[schedule.name], 0, last, entry.get("last_intent"))
            plan.next_ms = next_after(schedule, start if last is None else last)
            if last is not None and plan.next_ms <= start:
                missed = plan.next_ms
                plan.next_ms = next_after(schedule, start)
                if schedule.catch_up:
                    due_now.append(_Plan(schedule, plan.pubkey, missed))
                else:
                    await trio.to_thread.run_sync(lambda n=schedule.name, m=missed: self.state.save(n, last_slot_ms=m, skipped=True))
                    await self.audit.record("schedule.skipped", {"schedule": schedule.name, "slot_ms": missed,
                                                                 "reason": "daemon_down", "catch_up": False})
            self.plans[schedule.name] = plan
        async with trio.open_nursery() as nursery:
            task_status.started()
            for missed in due_now:
                await self._fire(nursery, self.plans[missed.schedule.name], missed.next_ms, catch_up=True)
            while self.plans:
                soonest = min(self.plans.values(), key=lambda p: p.next_ms)
                await trio.sleep(max(0, soonest.next_ms - now_ms()) / 1000)
                if self.daemon.shutting_down:
                    await trio.sleep_forever()
                slot = soonest.next_ms
                soonest.next_ms = next_after(soonest.schedule, max(slot, now_ms()) if soonest.schedule.cron else slot)
                await self._fire(nursery, soonest, slot, catch_up=False)

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
