"""The daemon keeps Rune agents' sessions: loaded before an intent is invoked, appended through the gateway.

Session files (``<home>/state/sessions/<agent id>/``, 0700, files 0600) are the daemon's, so no process
of an agent's uid (its replica, its tools) can read or rewrite them. For an intent whose agent keeps
sessions, the daemon takes the session's lock, loads and verifies the file (the starter must be the
intent's signed issuer, the file must reach its signed head: :mod:`covenant.rune.session_heads`), sends
the turns in the invoke, and appends what the replica checkpoints to that same log, recording the new
head: an ``on_finish`` turn from its answer (no round trip), ``each_step`` turns as they come
(``POST /v1/session/append`` on the gateway). The lock is held until the invoke ends: two intents of
one session run one after the other, each seeing the turns of the one before.

Each load of a session with turns is audited (``session.loaded``) with the session's tier
(:mod:`covenant.rune.session_tiers`): ``clean``, ``suspicious`` with the reasons — loaded with a warning,
or refused as ``session_suspicious`` under ``[rune] suspicious = "refuse"`` — or ``tainted`` (it failed
verification: refused as ``session_corrupt``). Every turn the replica gets carries its age (``age_ms``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.clock import now_ms
from covenant.keyed_locks import KeyedLocks
from covenant.rune.session_heads import HeadProblem, SessionHead, check_head, head_path, read_head, write_head
from covenant.rune.session_tiers import Assessment, assess, tainted
from covenant.rune.sessions import SessionLog, SessionRefused, open_session, session_path

if TYPE_CHECKING:
    from covenant.daemon.intent_context import IntentContext

__all__ = ["SessionKeeper", "SessionRefused"]

log = logging.getLogger("covenant.rune")

_SESSION = "session"
"""The intent's open :class:`SessionLog` in ``IntentContext.state``, from its load to its end."""


class SessionKeeper:
    """The sessions of every Rune agent of one daemon, under ``sessions_dir``."""

    def __init__(
        self, sessions_dir: Path, key: Ed25519PrivateKey, *,
        audit: Callable[[str, dict[str, Any]], Awaitable[Any]] | None = None,
        suspicious: Literal["warn", "refuse"] = "warn",
    ) -> None:
        self.sessions_dir = sessions_dir
        self._key = key
        """The daemon's key: it signs each session's head."""
        self._public_key = key.public_key()
        self._locks = KeyedLocks()
        self._audit = audit
        self.suspicious = suspicious
        """``[rune] suspicious``: what a load of a suspicious session does."""

    async def _record_load(self, intent: IntentContext, assessment: Assessment, turns: int, *, refused: bool,
                           oldest_ms: int | None = None) -> None:
        if self._audit is not None:
            await self._audit("session.loaded", {
                "intent": intent.intent_id, "agent": intent.agent.id, "session": intent.session_id, "turns": turns,
                "tier": assessment.tier, "tier_reasons": assessment.reasons, "refused": refused,
                "oldest_age_ms": None if oldest_ms is None else max(0, now_ms() - oldest_ms),
            })

    @asynccontextmanager
    async def held(self, intent: IntentContext) -> AsyncIterator[dict[str, Any] | None]:
        """The intent's session, loaded and verified, as the invoke carries it (``{"records", "torn_bytes"}``);
        no other intent uses the session until this ends. None when the agent keeps no sessions
        (``checkpoint_policy: never``: its replica remembers them). Raises :class:`SessionRefused`."""
        if intent.package.runefile.runtime.checkpoint_policy == "never":
            yield None
            return
        async with self._locks.hold((intent.agent.id, intent.session_id)):
            try:
                # A new session's load only finds that nothing is there: done on the loop, no worker thread.
                session = self._load(intent) if self._is_new(intent) else await trio.to_thread.run_sync(self._load, intent)
            except SessionRefused as exc:
                if exc.code == "session_corrupt":
                    log.warning("session refused", extra={"agent": intent.agent.id, "session": intent.session_id,
                                                          "intent": intent.intent_id, "reason": exc.reason})
                    await self._record_load(intent, tainted(exc.message), 0, refused=True)
                raise
            torn = session.verified.torn_bytes
            if torn:
                log.warning("session torn tail cut", extra={"agent": intent.agent.id, "session": intent.session_id,
                                                            "bytes": torn})
            turns = session.verified.turns
            if turns:
                await self._judge(intent, turns)
            intent.state[_SESSION] = session
            now = now_ms()
            aged = [{**turn, "age_ms": max(0, now - turn["at_ms"])} if isinstance(turn.get("at_ms"), int) else turn
                    for turn in turns]
            yield {"records": aged, "torn_bytes": torn}

    async def _judge(self, intent: IntentContext, turns: list[dict[str, Any]]) -> None:
        """Audit the load with the session's tier; refuse a suspicious one under ``[rune] suspicious = "refuse"``."""
        assessment = await trio.to_thread.run_sync(assess, turns)
        stamps = [t["at_ms"] for t in turns if isinstance(t.get("at_ms"), int)]
        refuse = assessment.tier == "suspicious" and self.suspicious == "refuse"
        await self._record_load(intent, assessment, len(turns), refused=refuse, oldest_ms=min(stamps, default=None))
        if assessment.tier != "suspicious":
            return
        log.warning("session suspicious", extra={"agent": intent.agent.id, "session": intent.session_id,
                                                 "intent": intent.intent_id, "reasons": assessment.reasons,
                                                 "refused": refuse})
        if refuse:
            raise SessionRefused(
                "session_suspicious",
                f"session {intent.session_id} refused (suspicious, [rune] suspicious = \"refuse\"): "
                + "; ".join(assessment.reasons[:3]) + "; start a new session, or inspect it with "
                f"`covenant sessions verify {intent.agent.id} {intent.session_id}`", "suspicious")

    def _is_new(self, intent: IntentContext) -> bool:
        """True when the session has neither a file nor a head (two ``lstat`` calls): its load reads nothing.
        Called under the session's lock, so no other intent of this daemon makes either meanwhile."""
        try:
            path = session_path(self.sessions_dir, intent.agent.id, intent.session_id)
        except ValueError:  # the load refuses it, with its reason
            return False
        return not os.path.lexists(path) and not os.path.lexists(head_path(path))

    def _load(self, intent: IntentContext) -> SessionLog:
        """Open and verify the intent's session, and check that its file reaches its signed head (blocking)."""
        session = open_session(self.sessions_dir, intent.agent.id, intent.session_id, intent.issuer_pubkey, now_ms())
        try:
            head = read_head(session.path, intent.agent.id, intent.session_id, self._public_key)
            check_head(session.path, session.verified.records if session.on_disk else [], head)
        except HeadProblem as exc:
            raise SessionRefused("session_corrupt", f"session {intent.session_id} refused ({exc.reason}): "
                                                    f"{exc.message}", exc.reason) from None
        return session

    async def append(self, intent: IntentContext, messages: list[dict[str, Any]]) -> None:
        """One turn appended, durably, to the session the intent holds, and its new head recorded; raise
        LookupError when it holds none."""
        session: SessionLog | None = intent.state.get(_SESSION)
        if session is None:
            raise LookupError(f"intent {intent.intent_id} holds no session")

        def append_and_record_head() -> None:
            session.append_turn(intent.intent_id, messages)
            last = session.verified.records[-1]
            write_head(session.path, intent.agent.id, intent.session_id, SessionHead(last["seq"], last["hash"]),
                       self._key)

        await trio.to_thread.run_sync(append_and_record_head)
