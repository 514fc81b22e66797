"""What a daemon that died with intents in flight leaves for the next start to record.

After ``kill -9``, a crash or lost power the audit log has intents with a
decision and no end. At start, before any new work, each gets an
``intent.interrupted`` event; each that was allowed to an agent also gets a
dispatch record with outcome ``interrupted`` (in the same commit), so
``covenant show`` and ``covenant history`` tell how it ended. The record holds
what the log knows of the run (the agent, and the pid, argv and limits of its
``agent.spawned``); its ``agent_version``, ``runtime``, ``isolation`` and ``uid``
are the agent's as this start finds it, ``duration_ms`` is 0 (when the agent
died is not known), and ``peer_uid`` is the one its ``intent.received`` kept, so
the user who submitted it reads it as they read their other records.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio
from pydantic import ValidationError

from covenant.audit.events import INTENT_INTERRUPTED
from covenant.audit.recent import UNFINISHED_SCAN_MAX_BYTES, unfinished_intents
from covenant.audit.writer import AuditLog
from covenant.home import Home
from covenant.manifest.registry import Registry
from covenant.runtime.isolation import Isolation
from covenant.runtime.outcome import DispatchRecord
from covenant.runtime.records import encode_record

__all__ = ["INTERRUPTED_REASON", "record_interrupted_intents"]

log = logging.getLogger("covenant.daemon")

INTERRUPTED_REASON = (
    "the daemon's last run ended without a clean stop (killed, crashed or the machine lost power) while this "
    "intent was in flight; its agent's processes died with the daemon (PDEATHSIG) or by this start's sweep"
)


async def record_interrupted_intents(home: Home, audit: AuditLog, registry: Registry, isolation: Isolation) -> None:
    """An ``intent.interrupted`` for each intent the last run received and never finished, with a dispatch
    record for each that had an agent; nothing after a clean stop."""
    unfinished, cut_short = await trio.to_thread.run_sync(unfinished_intents, home.audit_dir)
    if cut_short:
        log.warning("looked for unfinished intents in the newest part of the audit log only",
                    extra={"bytes": UNFINISHED_SCAN_MAX_BYTES})
    for entry in unfinished:
        spawned, peer_uid = entry.pop("spawned"), entry.pop("peer_uid")
        record = _record(entry, spawned, peer_uid, registry, isolation)
        await audit.record_many([(INTENT_INTERRUPTED, {**entry, "reason": INTERRUPTED_REASON})],
                                dispatch_record=None if record is None else encode_record(record))
    if unfinished:
        log.warning("intents left unfinished by the daemon's last run", extra={"intents": len(unfinished)})


def _record(
    entry: dict[str, Any], spawned: dict[str, Any] | None, peer_uid: int | None, registry: Registry, isolation: Isolation
) -> DispatchRecord | None:
    """The dispatch record of an interrupted intent; None when it never had an agent (or the log's data
    does not fit a record: then the event alone tells)."""
    agent_id = entry["agent"]
    if agent_id is None:
        return None
    agent = registry.agents.get(agent_id)
    creds = isolation.known_credentials(agent_id) if isolation.enforced else None
    spawned = spawned or {}
    try:
        return DispatchRecord.without_process(
            t0=time.monotonic(),
            intent_id=entry["intent"],
            agent_id=agent_id,
            agent_version=agent.version if agent is not None else "unknown",
            runtime=agent.runtime if agent is not None else "unknown",
            argv=spawned.get("argv") or [],
            limits=spawned.get("limits") or {},
            pid=spawned.get("pid"),
            started_at=entry["received"],
            outcome="interrupted",
            error=INTERRUPTED_REASON,
            result=None,
            parent=entry["parent"],
            peer_uid=peer_uid,
            isolation="uid" if creds is not None else "same-uid",
            uid=creds.uid if creds is not None else None,
        )
    except ValidationError as exc:
        log.warning("no dispatch record for an interrupted intent", extra={"intent": entry["intent"], "detail": str(exc)[:300]})
        return None
