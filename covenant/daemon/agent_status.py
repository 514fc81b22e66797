"""``GET /v1/agents/{id}/status`` and ``covenant status AGENT``: one agent as the daemon runs it now.

Beside the daemon-wide :mod:`covenant.daemon.status_view`, on purpose: this one answers "what is this
agent doing", the way ``supervisorctl status NAME`` does — stopped or not, the registry's word for it
(loaded, running its snapshot, withdrawn, removed), its file, its replica, what is in flight and how
its last dispatch ended.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from covenant.clock import iso_ms

if TYPE_CHECKING:
    from covenant.daemon.service import Daemon
    from covenant.runtime.outcome import DispatchRecord

__all__ = ["agent_status"]


def _registry_state(daemon: Daemon, agent_id: str) -> dict[str, Any]:
    """``registry`` (``loaded``, ``snapshot``, ``withdrawn`` or ``removed``) and ``file``: the manifest it was loaded
    from, or the rejected one it waits on."""
    loaded = daemon.agents.loaded
    if agent_id in loaded.agents:
        state = loaded.state_of(agent_id)
        if state["state"] != "loaded":  # ``snapshot``: it runs its last valid version, waiting on its file
            return {"registry": state["state"], "file": state.get("waiting_on"), "waiting_on": state.get("waiting_on")}
        file = next((str(path) for path, found in loaded.sources.items() if found == agent_id), None)
        return {"registry": "loaded", "file": file}
    if agent_id in loaded.withdrawn:
        return {"registry": "withdrawn", "file": str(loaded.withdrawn[agent_id])}
    return {"registry": "removed", "file": None}


def _stop_view(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    return {"at_ms": entry["at_ms"], "at": iso_ms(entry["at_ms"]), "by_uid": entry.get("by_uid")}


def _last_dispatch(record: DispatchRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {"intent_id": record.intent_id, "outcome": record.outcome, "ended_at": record.ended_at,
            "duration_ms": record.duration_ms, "error": record.error}


def agent_status(daemon: Daemon, agent_id: str, last: DispatchRecord | None) -> dict[str, Any]:
    """The status document of ``agent_id``; ``last`` is its newest dispatch record the caller may read.

    ``state`` is ``stopped`` while an operator has it stopped, else the registry's word (``registry``).
    """
    registry = _registry_state(daemon, agent_id)
    stopped = _stop_view(daemon.agents.stopped.get(agent_id))
    agent = daemon.agents.loaded.agents.get(agent_id)
    now = time.monotonic()
    running = [d for d in daemon.inflight.values() if d.agent_id == agent_id]
    replica = daemon.rune.replicas.replicas.get(agent_id)
    document: dict[str, Any] = {
        "agent": agent_id,
        "state": "stopped" if stopped is not None else registry["registry"],
        **registry,
        "stopped": stopped,
        "runtime": agent.runtime if agent is not None else None,
        "version": agent.version if agent is not None else None,
        "in_flight": [{"intent": d.intent_id, "elapsed_ms": int((now - d.started) * 1000)} for d in running],
        "replica": replica.view() if replica is not None else None,
        "last_dispatch": _last_dispatch(last),
    }
    return document
