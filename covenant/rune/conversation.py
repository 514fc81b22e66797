"""One intent against one session: load and verify, window, run the loop, checkpoint.

Shared by the replica (:mod:`covenant.rune.host`) and ``covenant run``. A
replica's sessions are the daemon's files (:mod:`covenant.daemon.session_keeper`):
the daemon loads and verifies the intent's session before it invokes the
replica, and a corrupt one fails the intent with ``session_corrupt`` before any
model request; the replica reads the turns and writes its checkpoints through
a :class:`SessionStore` (its gateway client), so no process of the agent's uid
can read or rewrite the files. ``checkpoint_policy``: ``on_finish`` appends the intent's
messages once it succeeded, ``each_step`` after every model turn, ``never``
keeps the session in this process's memory only (lost with it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from covenant.keyed_locks import KeyedLocks
from covenant.rune.history import window
from covenant.rune.loop import Backend, EventSink, LoopFailed, LoopResult, LoopSpec, run_loop
from covenant.rune.sessions import valid_session_id

__all__ = ["SessionPolicy", "SessionStore", "Conversations", "new_session_id"]

_MEMORY_SESSIONS_MAX = 1000


class SessionStore(Protocol):
    """The session of one intent, kept by whoever holds the files (the daemon)."""

    async def load_session(self) -> tuple[list[dict[str, Any]], int]:
        """Its turn records (none for a new session) and the bytes of a torn tail that was cut."""

    async def append_session(self, messages: list[dict[str, Any]]) -> None:
        """Append one turn durably (``each_step``); raise LoopFailed."""

    async def finish_session(self, messages: list[dict[str, Any]]) -> None:
        """The intent's one turn (``on_finish``), written by the store's holder before the intent is answered."""


def new_session_id() -> str:
    return os.urandom(16).hex()


@dataclass(frozen=True)
class SessionPolicy:
    memory_profile: str = "minimal"
    standard_turns: int = 20
    token_budget: int = 100_000
    checkpoint_policy: str = "on_finish"


@dataclass
class _Memory:
    issuer: str
    turns: list[list[dict[str, Any]]] = field(default_factory=list)


def _group_turns(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Records of one intent (several with each_step) form one turn."""
    turns: list[list[dict[str, Any]]] = []
    last_intent: object = None
    for record in records:
        if record.get("intent") != last_intent or not turns:
            turns.append([])
            last_intent = record.get("intent")
        turns[-1].extend(m for m in record["messages"] if isinstance(m, dict))
    return turns


class Conversations:
    """Sessions of one agent; one intent at a time per session (others on it wait)."""

    def __init__(self, policy: SessionPolicy) -> None:
        self.policy = policy
        self._sessions = KeyedLocks()
        self._memory: dict[str, _Memory] = {}

    async def answer(
        self,
        spec: LoopSpec,
        backend: Backend,
        *,
        text: str,
        issuer: str,
        session_id: str | None,
        store: SessionStore | None = None,
        emit: EventSink | None = None,
        notes: dict[str, Any] | None = None,
    ) -> tuple[str, LoopResult]:
        """(session id, result); raise LoopFailed. ``store`` keeps the session unless ``checkpoint_policy``
        is ``never``; ``notes`` gets ``torn_bytes`` when a tail was cut."""
        session_id = session_id or new_session_id()
        if not valid_session_id(session_id):
            raise LoopFailed("bad_request", f"session id {session_id!r}: use 1-128 of A-Za-z0-9._-")
        async with self._sessions.hold(session_id):
            return session_id, await self._answer(spec, backend, text, issuer, session_id, store, emit, notes)

    async def _answer(
        self, spec: LoopSpec, backend: Backend, text: str, issuer: str, session_id: str,
        store: SessionStore | None, emit: EventSink | None, notes: dict[str, Any] | None,
    ) -> LoopResult:
        policy = self.policy
        if policy.checkpoint_policy == "never":
            store = None
            memory = self._memory.get(session_id)
            if memory is not None and memory.issuer != issuer:
                raise LoopFailed("session_forbidden", f"session {session_id} belongs to another issuer")
            turns = memory.turns if memory else []
        elif store is None:
            raise LoopFailed("session_corrupt", f"checkpoint_policy {policy.checkpoint_policy!r} needs a session store")
        else:
            records, torn_bytes = await store.load_session()
            if torn_bytes and notes is not None:
                notes["torn_bytes"] = torn_bytes
            turns = _group_turns(records)
        history = window(turns, profile=policy.memory_profile, standard_turns=policy.standard_turns,
                         token_budget=policy.token_budget)
        on_step = store.append_session if store is not None and policy.checkpoint_policy == "each_step" else None
        result = await run_loop(spec, backend, history, text, emit=emit, on_step=on_step)
        if store is not None and policy.checkpoint_policy == "on_finish":
            await store.finish_session(result.messages)
        elif store is None:
            memory = self._memory.setdefault(session_id, _Memory(issuer))
            memory.turns.append(result.messages)
            while len(self._memory) > _MEMORY_SESSIONS_MAX:
                self._memory.pop(next(iter(self._memory)))
        return result
