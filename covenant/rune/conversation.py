"""One intent against one session: load and verify, window, run the loop, checkpoint.

Shared by the replica (:mod:`covenant.rune.host`) and ``covenant run``. The
session file is verified before anything is sent to a model: a corrupt
session fails the intent with ``session_corrupt`` and no model request.
``checkpoint_policy``: ``on_finish`` appends the intent's messages once it
succeeded, ``each_step`` after every model turn, ``never`` keeps the session
in this process's memory only (lost with it).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from covenant.rune.history import window
from covenant.rune.loop import Backend, EventSink, LoopFailed, LoopResult, LoopSpec, run_loop
from covenant.rune.sessions import SessionCorrupt, SessionLog, session_path, valid_session_id

__all__ = ["SessionPolicy", "Conversations", "new_session_id"]

log = logging.getLogger("covenant.rune")

_MEMORY_SESSIONS_MAX = 1000
_FILE_THREADS = 4


def new_session_id() -> str:
    return os.urandom(16).hex()


@dataclass(frozen=True)
class SessionPolicy:
    agent_id: str
    sessions_dir: Path
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
        # Session file work runs in threads; few of them: a replica lives under an address-space limit.
        self._files = trio.CapacityLimiter(_FILE_THREADS)
        self._locks: dict[str, trio.Lock] = {}
        self._memory: dict[str, _Memory] = {}

    async def answer(
        self,
        spec: LoopSpec,
        backend: Backend,
        *,
        text: str,
        intent_id: str,
        issuer: str,
        session_id: str | None,
        emit: EventSink | None = None,
        notes: dict[str, Any] | None = None,
    ) -> tuple[str, LoopResult]:
        """(session id, result); raise LoopFailed. ``notes`` gets ``torn_bytes`` when a tail was cut."""
        session_id = session_id or new_session_id()
        if not valid_session_id(session_id):
            raise LoopFailed("bad_request", f"session id {session_id!r}: use 1-128 of A-Za-z0-9._-")
        lock = self._locks.setdefault(session_id, trio.Lock())
        async with lock:
            try:
                return session_id, await self._answer(spec, backend, text, intent_id, issuer, session_id, emit, notes)
            finally:
                if not lock.statistics().tasks_waiting:
                    self._locks.pop(session_id, None)

    async def _answer(
        self, spec: LoopSpec, backend: Backend, text: str, intent_id: str, issuer: str, session_id: str,
        emit: EventSink | None, notes: dict[str, Any] | None,
    ) -> LoopResult:
        policy = self.policy
        store: SessionLog | None = None
        if policy.checkpoint_policy == "never":
            memory = self._memory.get(session_id)
            if memory is not None and memory.issuer != issuer:
                raise LoopFailed("session_forbidden", f"session {session_id} belongs to another issuer")
            turns = memory.turns if memory else []
        else:
            store = await trio.to_thread.run_sync(self._open, session_id, issuer, notes, limiter=self._files)
            turns = _group_turns(store.verified.turns)
        history = window(turns, profile=policy.memory_profile, standard_turns=policy.standard_turns,
                         token_budget=policy.token_budget)

        on_step = None
        if store is not None and policy.checkpoint_policy == "each_step":
            async def on_step(messages: list[dict[str, Any]]) -> None:
                await trio.to_thread.run_sync(store.append_turn, intent_id, messages, limiter=self._files)

        result = await run_loop(spec, backend, history, text, emit=emit, on_step=on_step)
        if store is not None and policy.checkpoint_policy == "on_finish":
            await trio.to_thread.run_sync(store.append_turn, intent_id, result.messages, limiter=self._files)
        elif store is None:
            memory = self._memory.setdefault(session_id, _Memory(issuer))
            memory.turns.append(result.messages)
            while len(self._memory) > _MEMORY_SESSIONS_MAX:
                self._memory.pop(next(iter(self._memory)))
        return result

    def _open(self, session_id: str, issuer: str, notes: dict[str, Any] | None) -> SessionLog:
        path = session_path(self.policy.sessions_dir, self.policy.agent_id, session_id)
        try:
            store = SessionLog.open(path)
        except FileNotFoundError:
            return SessionLog.new(path, agent=self.policy.agent_id, session=session_id, issuer=issuer,
                                  now_ms=int(time.time() * 1000))
        except SessionCorrupt as exc:
            raise LoopFailed("session_corrupt", f"session {session_id} refused: {exc}") from None
        except OSError as exc:
            raise LoopFailed("session_corrupt", f"session {session_id}: cannot read {path}: {exc.strerror or exc}") from None
        if store.verified.torn_bytes:
            log.warning("session torn tail cut", extra={"session": session_id, "bytes": store.verified.torn_bytes})
            if notes is not None:
                notes["torn_bytes"] = store.verified.torn_bytes
        if store.verified.header.get("issuer") != issuer:
            raise LoopFailed("session_forbidden", f"session {session_id} was started by another issuer; start a new session")
        return store
