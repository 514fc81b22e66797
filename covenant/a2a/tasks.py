"""Which A2A task belongs to which client, and how a dispatch's outcome reads as a task state.

A task id is the intent id of its dispatch. The dispatch record is the truth
about how it ended; this ledger adds what the record does not hold: the client
that asked (only it may read or cancel the task), the context id, and the end
of a task that never ran (a policy denial leaves no record). The ledger is
rebuilt at start from the last day's audit log (``a2a.request`` events, and
the ``policy.decision`` denials of their intents), so a client can still read
its tasks after a restart.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import trio

from covenant.runtime.outcome import DispatchRecord

__all__ = ["TaskEntry", "TaskLedger", "state_of_outcome", "note_of"]

MAX_TASKS = 10_000
"""Tasks remembered; the oldest are forgotten first (their records stay in the dispatch store)."""


def state_of_outcome(outcome: str) -> str:
    """A dispatch outcome as an A2A task state (without the ``TASK_STATE_`` prefix)."""
    if outcome == "ok":
        return "COMPLETED"
    if outcome == "cancelled":
        return "CANCELED"
    return "FAILED"


def note_of(outcome: str) -> str | None:
    """The status message of a task that did not complete: the outcome code alone. The record's ``error`` may
    name paths, argv or uids (a spawn that failed, a protocol error's first bytes): it is for operators only."""
    return None if outcome == "ok" else outcome


@dataclass
class TaskEntry:
    task_id: str
    client: str
    context_id: str
    agent: str
    state: str = "WORKING"
    note: str | None = None
    answer: str | None = None
    updated_at: str = ""
    restored: bool = False
    """Known from the audit log of an earlier run: never running in this one."""
    done: trio.Event = field(default_factory=trio.Event)

    def finish(self, state: str, *, answer: str | None, note: str | None, at: str) -> None:
        self.state, self.answer, self.note, self.updated_at = state, answer, note, at
        self.done.set()

    def settle_from(self, record: DispatchRecord) -> None:
        """A task known only from the audit log: its end as the dispatch record tells it."""
        answer = (record.result or {}).get("text") if record.outcome == "ok" else None
        self.finish(state_of_outcome(record.outcome), answer=answer, note=note_of(record.outcome),
                    at=record.ended_at)


class TaskLedger:
    """Task id -> entry, bounded; reads never reveal another client's task."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, TaskEntry] = OrderedDict()

    def add(self, entry: TaskEntry) -> TaskEntry:
        self._entries[entry.task_id] = entry
        self._entries.move_to_end(entry.task_id)
        while len(self._entries) > MAX_TASKS:
            self._entries.popitem(last=False)
        return entry

    def get(self, task_id: str, client: str) -> TaskEntry | None:
        entry = self._entries.get(task_id)
        return entry if entry is not None and entry.client == client else None

    def of_client(self, client: str, context_id: str | None = None) -> list[TaskEntry]:
        """The client's tasks, newest first."""
        return [e for e in reversed(self._entries.values())
                if e.client == client and (context_id is None or e.context_id == context_id)]

    def restore(self, events: list[tuple[str, dict[str, Any]]]) -> int:
        """Rebuild from ``a2a.request`` (the messages that made a task) and ``policy.decision`` (denials), oldest first."""
        for type_, data in events:
            task_id, client, context_id = data.get("task"), data.get("client"), data.get("context")
            if type_ == "a2a.request" and isinstance(task_id, str) and isinstance(client, str) and isinstance(context_id, str):
                self.add(TaskEntry(task_id, client, context_id, str(data.get("agent")), restored=True))
        # A denial may precede its request in the log (one group commit holds both): read denials second.
        for type_, data in events:
            denied = self._entries.get(str(data.get("intent"))) if type_ == "policy.decision" else None
            if denied is not None and data.get("allowed") is False:
                reason = f"{data.get('reason')}: {data.get('hint')}" if data.get("hint") else str(data.get("reason"))
                denied.finish("REJECTED", answer=None, note=reason, at="")
        return len(self._entries)
