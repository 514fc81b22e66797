"""What the audit log holds, and when, for one dispatch: against a real daemon and real agents.

An allowed dispatch that gets a run slot at once writes ``intent.received``,
``policy.decision`` and ``agent.spawned`` in one group commit (one checkpoint)
while the agent waits at its exec gate; ``agent.exited`` and
``intent.completed`` follow in a second one before the caller is answered. A
dispatch that has to queue commits its received and decision events before it
waits; one refused as overloaded commits them with its completion.
"""

from __future__ import annotations

import json

from tests.daemon.conftest import DaemonProcess
from tests.daemon.test_daemon_e2e import audit_records, status, wait_for


def log_lines(d: DaemonProcess) -> list[dict]:
    """Every line of the log, checkpoints included (``audit tail`` leaves those out)."""
    return [json.loads(line) for path in sorted((d.home / "audit").glob("audit-*.jsonl"))
            for line in path.read_text().splitlines()]


def events_of(records: list[dict], intent_id: str) -> list[tuple[str, int]]:
    """(type, seq) of the intent's events, in log order."""
    return [(r["type"], r["seq"]) for r in records if r["data"].get("intent") == intent_id]


def checkpoint_after(records: list[dict], seq: int) -> int:
    """seq of the first checkpoint at or after ``seq``."""
    return next(r["seq"] for r in records if r["seq"] >= seq and r["type"] == "audit.checkpoint")


def test_allowed_dispatch_is_two_group_commits(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.start()
    outcome = json.loads(daemon.cli("dispatch", "echo once", "--json", check=True).stdout)
    assert daemon.stop() == 0
    records = log_lines(daemon)
    events = events_of(records, outcome["intent_id"])
    assert [t for t, _ in events] == [
        "intent.received", "policy.decision", "agent.spawned", "agent.exited", "intent.completed",
    ]
    seqs = [s for _, s in events]
    # Adjacent, each commit closed by its own checkpoint: 3 events + checkpoint, 2 events + checkpoint.
    assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2, seqs[0] + 4, seqs[0] + 5]
    assert checkpoint_after(records, seqs[0]) == seqs[0] + 3
    assert checkpoint_after(records, seqs[3]) == seqs[0] + 6
    spawned = next(r["data"] for r in records if r["seq"] == seqs[2])
    assert spawned["pid"] == outcome["record"]["pid"] and spawned["argv"] == outcome["record"]["argv"]
    assert daemon.cli("audit", "verify").returncode == 0


def test_queued_dispatch_is_audited_before_it_waits(daemon: DaemonProcess) -> None:
    daemon.start_with_one_slot("--drain-timeout", "1")
    first = daemon.cli_background("dispatch", "sleep 600", "--json")
    wait_for(lambda: len(status(daemon)["in_flight"]) == 1, what="the first dispatch running")
    second = daemon.cli_background("dispatch", "sleep 0", "--json")
    wait_for(lambda: status(daemon)["queued"] == 1, what="the second dispatch queued")

    def queued_intent_audited() -> bool:
        received = [r for r in audit_records(daemon) if r["type"] == "intent.received"]
        return len(received) == 2

    wait_for(queued_intent_audited, what="the queued intent's received event")
    records = audit_records(daemon)
    running = status(daemon)["in_flight"][0]["intent"]
    # Not the second received event: the running one's first three events are one commit made at its
    # spawn, which may come after the queued one wrote its own (its uid's namespaces made first).
    (queued_id,) = [r["data"]["intent"] for r in records if r["type"] == "intent.received" and r["data"]["intent"] != running]
    assert [t for t, _ in events_of(records, queued_id)] == ["intent.received", "policy.decision"]
    assert status(daemon)["queued"] == 1  # still waiting: nothing of it has run

    refused = daemon.cli("dispatch", "sleep 0", "--json")
    assert refused.returncode == 5 and "saturated" in refused.stderr

    assert daemon.stop() == 5  # the sleeper outlives the drain and is cancelled; the queued one refused
    for proc in (first, second):
        proc.communicate(timeout=120)
        assert proc.returncode == 5
    records = audit_records(daemon)
    completed = {r["data"]["intent"]: r["data"]["outcome"] for r in records if r["type"] == "intent.completed"}
    assert completed[running] == "cancelled" and completed[queued_id] == "shutting_down"
    assert [t for t, _ in events_of(records, queued_id)] == ["intent.received", "policy.decision", "intent.completed"]
    refused_ids = {r["data"]["intent"] for r in records if r["type"] == "intent.received"} - {running, queued_id}
    assert len(refused_ids) == 1
    refused_id = refused_ids.pop()
    assert completed[refused_id] == "overloaded"
    assert [t for t, _ in events_of(records, refused_id)] == ["intent.received", "policy.decision", "intent.completed"]
    assert daemon.cli("audit", "verify").returncode == 0
