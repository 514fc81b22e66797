"""Schedules in a real daemon: every 3 s across a restart without a double fire, grants decide each firing."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from covenant.audit.recent import records_since
from tests.daemon.conftest import DaemonProcess

PERIOD_S = 3
"""The shortest period that keeps at most one slot coming due while a loaded box drains the daemon."""
_TYPES = frozenset({"schedule.fire", "schedule.skipped", "policy.decision", "intent.completed", "intent.received"})


def _records(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return records_since(daemon.home / "audit", 0, _TYPES)[::-1]  # oldest first


def _wait(daemon: DaemonProcess, what: str, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = _records(daemon)
        if done(records):
            return records
        time.sleep(0.2)
    raise AssertionError(f"no {what} after {timeout} s:\n{daemon.log()[-4000:]}")


def _fires(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r["data"] for r in records if r["type"] == "schedule.fire" and r["data"]["schedule"] == name]


def _setup(daemon: DaemonProcess, marks: Path) -> None:
    marks.mkdir()
    os.chmod(marks, 0o777)
    daemon.add_agent("mark", "mark.py", required=("tool.mark",))
    daemon.cli("grant", "tester@test", "tool.mark", check=True)
    daemon.cli("identity", "add", "mallory@box", secrets.token_hex(32), check=True)
    daemon.write_config(f"""
        [[schedules]]
        name = "tick"
        agent = "mark@local"
        input = "mark {marks}"
        every = "{PERIOD_S}s"
        issuer = "tester@test"

        [[schedules]]
        name = "sneaky"
        agent = "mark@local"
        input = "mark {marks}"
        every = "{PERIOD_S}s"
        issuer = "mallory@box"
    """)


def test_every_3s_survives_a_restart_without_a_double_fire_and_grants_decide(daemon: DaemonProcess) -> None:
    marks = daemon.home.parent / "marks"
    _setup(daemon, marks)
    daemon.start()
    _wait(daemon, "two ticks", lambda rs: len(_fires(rs, "tick")) >= 2)
    assert daemon.stop() == 0
    before = _fires(_records(daemon), "tick")
    state = json.loads((daemon.home / "state" / "schedules.json").read_text())
    assert state["schedules"]["tick"]["last_slot_ms"] == before[-1]["slot_ms"]
    assert state["schedules"]["tick"]["last_intent"] == before[-1]["intent"]

    daemon.start()
    records = _wait(daemon, "two more ticks", lambda rs: len(_fires(rs, "tick")) >= len(before) + 2)
    listed = {s["name"]: s for s in json.loads(daemon.cli("schedules", "--json", check=True).stdout)["schedules"]}
    assert listed["tick"]["every"] == f"{PERIOD_S}s" and listed["tick"]["issuer"] == "tester@test"
    assert listed["tick"]["last_ms"] >= _fires(records, "tick")[-1]["slot_ms"]
    assert listed["tick"]["next_ms"] > listed["tick"]["last_ms"]
    table = daemon.cli("schedules", check=True).stdout
    assert "tick" in table and f"every {PERIOD_S}s" in table and "sneaky" in table
    assert daemon.stop() == 0
    records = _records(daemon)
    ticks = _fires(records, "tick")
    slots = [t["slot_ms"] for t in ticks]
    assert len(slots) == len(set(slots)), f"a slot fired twice: {slots}"
    assert slots == sorted(slots)
    period_ms = PERIOD_S * 1000
    skipped = {slot for r in records if r["type"] == "schedule.skipped" and r["data"]["schedule"] == "tick"
               for slot in range(r["data"]["slot_ms"], r["data"]["through_ms"] + 1, period_ms)}
    assert all(r["data"]["slots"] == (r["data"]["through_ms"] - r["data"]["slot_ms"]) // period_ms + 1
               for r in records if r["type"] == "schedule.skipped" and r["data"]["schedule"] == "tick")
    # Each slot follows the one before by one period, unless the slots between were audited as skipped.
    for earlier, later in zip(slots, slots[1:]):
        between = set(range(earlier + period_ms, later, period_ms))
        assert later - earlier >= period_ms and (later - earlier) % period_ms == 0 or skipped, (earlier, later)
        assert between <= skipped, f"slots {sorted(between - skipped)} neither fired nor recorded as skipped"
    # The first slot after the restart is after the last one before it: nothing fired twice.
    assert ticks[len(before)]["slot_ms"] > before[-1]["slot_ms"]

    completed = {r["data"]["intent"]: r["data"] for r in records if r["type"] == "intent.completed"}
    decisions = {r["data"]["intent"]: r["data"] for r in records if r["type"] == "policy.decision"}
    received = {r["data"]["intent"]: r["data"] for r in records if r["type"] == "intent.received"}
    # A slot that came due while the daemon was draining is recorded but refused (shutting_down): at most
    # the last tick before each stop.
    last_before_stop = {before[-1]["intent"], ticks[-1]["intent"]}
    ticks = [t for t in ticks if t["intent"] in received or t["intent"] not in last_before_stop]
    for tick in ticks:
        assert received[tick["intent"]]["issuer_display"] == "tester@test"
        assert decisions[tick["intent"]]["allowed"] is True
        assert completed[tick["intent"]]["outcome"] == "ok"
    assert sorted(p.name for p in marks.iterdir()) == sorted(t["intent"] for t in ticks)

    sneaky = _fires(records, "sneaky")
    assert sneaky, "the schedule of an issuer without the grant never fired"
    for fire in sneaky:
        if fire["intent"] not in received:
            continue  # came due during a drain
        assert fire["issuer_display"] == "mallory@box"
        assert decisions[fire["intent"]]["allowed"] is False
        assert decisions[fire["intent"]]["reason"] == "capability_denied"
        assert fire["intent"] not in completed


def test_a_missed_slot_is_skipped_or_caught_up(daemon: DaemonProcess) -> None:
    marks = daemon.home.parent / "marks"
    marks.mkdir()
    os.chmod(marks, 0o777)
    daemon.add_agent("mark", "mark.py")
    daemon.write_config(f"""
        [[schedules]]
        name = "late"
        agent = "mark@local"
        input = "mark {marks}"
        every = "1h"
        issuer = "tester@test"

        [[schedules]]
        name = "eager"
        agent = "mark@local"
        input = "mark {marks}"
        every = "1h"
        issuer = "tester@test"
        catch_up = true
    """)
    old = int(time.time() * 1000) - 2 * 3_600_000
    state = daemon.home / "state" / "schedules.json"
    state.write_text(json.dumps({"version": 1, "schedules": {
        "late": {"last_slot_ms": old}, "eager": {"last_slot_ms": old}}}))
    daemon.start()
    records = _wait(daemon, "the catch-up fire", lambda rs: bool(_fires(rs, "eager")) and any(
        r["type"] == "intent.completed" and r["data"]["intent"] == _fires(rs, "eager")[0]["intent"] for r in rs))
    assert daemon.stop() == 0
    records = _records(daemon)
    eager = _fires(records, "eager")
    assert len(eager) == 1 and eager[0]["catch_up"] is True and eager[0]["slot_ms"] == old + 3_600_000
    assert _fires(records, "late") == []
    skipped = [r["data"] for r in records if r["type"] == "schedule.skipped"]
    assert [(s["schedule"], s["slot_ms"]) for s in skipped] == [("late", old + 3_600_000)]
    assert [p.name for p in marks.iterdir()] == [eager[0]["intent"]]


def test_an_unknown_issuer_is_a_config_error_naming_the_schedule(daemon: DaemonProcess) -> None:
    daemon.add_agent("mark", "mark.py")
    daemon.write_config("""
        [[schedules]]
        name = "ghost"
        agent = "mark@local"
        every = "5s"
        issuer = "nobody@nowhere"
    """)
    daemon.process = daemon.cli_background("daemon")  # type: ignore[assignment]
    _, err = daemon.process.communicate(timeout=60)  # type: ignore[union-attr]
    assert daemon.process.returncode != 0
    assert "'ghost'" in err and "nobody@nowhere" in err and "identities.toml" in err


def test_an_agent_made_schedule_is_picked_up_fires_for_its_issuer_and_stops_when_deleted(daemon: DaemonProcess) -> None:
    from covenant.triggers.agent_schedules import AgentScheduleStore, agent_schedules_path
    from covenant.triggers.config import ScheduleConfig

    marks = daemon.home.parent / "marks"
    marks.mkdir()
    os.chmod(marks, 0o777)
    daemon.add_agent("mark", "mark.py")
    daemon.start()
    tester = json.loads(daemon.cli("identity", "show", "--json", check=True).stdout)["pubkey"]
    store = AgentScheduleStore(agent_schedules_path(daemon.home / "state"))
    schedule = ScheduleConfig(name="agentmade", agent="mark@local", input=f"mark {marks}", every="2s", issuer="tester@test")
    assert store.add(schedule, tester, "planner@local", int(time.time() * 1000)) is None
    records = _wait(daemon, "the agent schedule's first fire", lambda rs: any(
        r["type"] == "intent.completed" and r["data"]["intent"] in {f["intent"] for f in _fires(rs, "agentmade")}
        for r in rs))
    fire = _fires(records, "agentmade")[0]
    assert fire["issuer"] == tester
    assert store.delete("agentmade", tester)

    def unlisted() -> bool:
        doc = json.loads(daemon.cli("schedules", "--json", check=True).stdout)
        return all(s["name"] != "agentmade" for s in doc["schedules"])

    deadline = time.monotonic() + 60
    while not unlisted():
        assert time.monotonic() < deadline, "the deleted schedule is still listed"
        time.sleep(0.2)
    count = len(_fires(_records(daemon), "agentmade"))
    time.sleep(5)  # two and a half periods: a schedule still planned would have fired
    assert len(_fires(_records(daemon), "agentmade")) == count
    assert daemon.stop() == 0
