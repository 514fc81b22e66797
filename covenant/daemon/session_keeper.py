"""The daemon keeps Rune agents' sessions: loaded before an intent is invoked, appended through the gateway.

Session files (``<home>/state/sessions/<agent id>/``, 0700, files 0600) are the daemon's, so no process
of an agent's uid (its replica, its tools) can read or rewrite them. For an intent whose agent keeps
sessions, the daemon takes the session's lock, loads and verifies the file (the starter must be the
intent's signed issuer), sends the turns in the invoke, and appends what the replica checkpoints to
that same log: an ``on_finish`` turn from its answer (no round trip), ``each_step`` turns as they come
(``POST /v1/session/append`` on the gateway). The lock is held until the invoke ends: two intents of
one session run one after the other, each seeing the turns of the one before.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from covenant.clock import now_ms
from covenant.keyed_locks import KeyedLocks
from covenant.rune.sessions import SessionLog, SessionRefused, open_session

if TYPE_CHECKING:
    from covenant.daemon.intent_context import IntentContext

__all__ = ["SessionKeeper", "SessionRefused"]

log = logging.getLogger("covenant.rune")

_SESSION = "session"
"""The intent's open :class:`SessionLog` in ``IntentContext.state``, from its load to its end."""


class SessionKeeper:
    """The sessions of every Rune agent of one daemon, under ``sessions_dir``."""

    def __init__(self, sessions_dir: Path) -> None:
        self.sessions_dir = sessions_dir
        self._locks = KeyedLocks()

    @asynccontextmanager
    async def held(self, intent: IntentContext) -> AsyncIterator[dict[str, Any] | None]:
        """The intent's session, loaded and verified, as the invoke carries it (``{"records", "torn_bytes"}``);
        no other intent uses the session until this ends. None when the agent keeps no sessions
        (``checkpoint_policy: never``: its replica remembers them). Raises :class:`SessionRefused`."""
        if intent.package.runefile.runtime.checkpoint_policy == "never":
            yield None
            return
        async with self._locks.hold((intent.agent.id, intent.session_id)):
            session = await trio.to_thread.run_sync(
                open_session, self.sessions_dir, intent.agent.id, intent.session_id, intent.issuer_pubkey, now_ms()
            )
            torn = session.verified.torn_bytes
            if torn:
                log.warning("session torn tail cut", extra={"agent": intent.agent.id, "session": intent.session_id,
                                                            "bytes": torn})
            intent.state[_SESSION] = session
            yield {"records": session.verified.turns, "torn_bytes": torn}

    @staticmethod
    async def append(intent: IntentContext, messages: list[dict[str, Any]]) -> None:
        """One turn appended, durably, to the session the intent holds; raise LookupError when it holds none."""
        session: SessionLog | None = intent.state.get(_SESSION)
        if session is None:
            raise LookupError(f"intent {intent.intent_id} holds no session")
        await trio.to_thread.run_sync(session.append_turn, intent.intent_id, messages)
