"""Which A2A task belongs to which client, and how a dispatch's outcome reads as a task state.

A task id is the intent id of its first dispatch. A task that stopped to ask the
user (``INPUT_REQUIRED``: a Rune agent's ``rune@ask-user``) goes on with a new
intent when its client answers, so the entry names its current intent too. The
dispatch record of that intent is the truth about how the turn ended; this
ledger adds what the record does not hold: the client that asked (only it may
read, continue or cancel the task), the context id, and the end of a task that
never ran (a policy denial leaves no record) or was canceled while it waited for
input. The ledger is rebuilt at start from the last day's audit log
(``a2a.request`` events, and the ``policy.decision`` denials of their intents),
so a client can still read and continue its tasks after a restart.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import trio

from covenant.runtime.outcome import DispatchRecord

__all__ = ["TaskEntry", "TaskLedger", "state_of_outcome", "state_of_record", "note_of"]

MAX_TASKS = 10_000
"""Tasks remembered; the oldest are forgotten first (their records stay in the dispatch store)."""


def state_of_outcome(outcome: str) -> str:
    """A dispatch outcome as an A2A task state (without the ``TASK_STATE_`` prefix)."""
    if outcome == "ok":
        return "COMPLETED"
    if outcome == "cancelled":
        return "CANCELED"
    return "FAILED"


def state_of_record(record: DispatchRecord) -> tuple[str, str | None, str | None]:
    """(state, answer, note) of a turn as its dispatch record tells it: an answer that is ``rune@ask-user``'s
    question leaves the task ``INPUT_REQUIRED`` with the question as its status message."""
    result = record.result or {}
    if record.outcome == "ok" and result.get("input_required") is True:
        return "INPUT_REQUIRED", None, str(result.get("text") or "")
    answer = result.get("text") if record.outcome == "ok" else None
    return state_of_outcome(record.outcome), answer, note_of(record.outcome)


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
    intent_id: str = ""
    """The intent of the task's current turn: the task id itself for the first (set when empty)."""
    state: str = "WORKING"
    note: str | None = None
    answer: str | None = None
    updated_at: str = ""
    restored: bool = False
    """Known from the audit log of an earlier run: never running in this one."""
    done: trio.Event = field(default_factory=trio.Event)
    """Set when the current turn has ended (a terminal state, or INPUT_REQUIRED)."""
    files: list[dict[str, Any]] = field(default_factory=list)
    """The current turn's artifacts as its record lists them (``{name, media_type, bytes, sha256}``); their bytes
    are read from the daemon's store when a task document is made."""

    def __post_init__(self) -> None:
        self.intent_id = self.intent_id or self.task_id

    def finish(self, state: str, *, answer: str | None, note: str | None, at: str) -> None:
        self.state, self.answer, self.note, self.updated_at = state, answer, note, at
        self.done.set()

    def next_turn(self, intent_id: str) -> None:
        """The client answered the agent's question: the task works again, on intent ``intent_id``."""
        self.intent_id, self.state, self.answer, self.note, self.restored = intent_id, "WORKING", None, None, False
        self.files = []
        self.done = trio.Event()

    def settle_from(self, record: DispatchRecord) -> None:
        """A task known only from the audit log: where its current turn ended, as the dispatch record tells it."""
        state, answer, note = state_of_record(record)
        self.files = list(record.artifacts)
        self.finish(state, answer=answer, note=note, at=record.ended_at)


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
        """Rebuild from ``a2a.request`` (the messages that made or continued a task, the cancels of waiting
        tasks) and ``policy.decision`` (denials), oldest first."""
        for type_, data in events:
            task_id, client, context_id = data.get("task"), data.get("client"), data.get("context")
            if type_ != "a2a.request" or not isinstance(task_id, str) or not isinstance(client, str):
                continue
            known = self._entries.get(task_id)
            if data.get("settled") == "CANCELED" and known is not None and known.client == client:
                known.finish("CANCELED", answer=None, note=None, at="")
            elif (known is not None and known.client == client and isinstance(data.get("intent"), str)
                  and data["intent"] != known.intent_id):
                known.next_turn(data["intent"])  # a continuation: the task's turn is now this intent
                known.restored = True
                self._entries.move_to_end(task_id)
            elif known is None and isinstance(context_id, str):
                self.add(TaskEntry(task_id, client, context_id, str(data.get("agent")), restored=True))
        # A denial may precede its request in the log (one group commit holds both): read denials second.
        by_intent = {entry.intent_id: entry for entry in self._entries.values()}
        for type_, data in events:
            denied = by_intent.get(str(data.get("intent"))) if type_ == "policy.decision" else None
            if denied is not None and data.get("allowed") is False:
                reason = f"{data.get('reason')}: {data.get('hint')}" if data.get("hint") else str(data.get("reason"))
                denied.finish("REJECTED", answer=None, note=reason, at="")
        return len(self._entries)
