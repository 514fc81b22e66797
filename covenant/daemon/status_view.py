"""``GET /v1/status`` and ``covenant status``: one document of the daemon's state."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import trio

from covenant import __version__
from covenant.clock import ms_from_iso, now_ms
from covenant.homeinit import mode_problems
from covenant.spawned_ids import is_spawned_id

if TYPE_CHECKING:
    from covenant.daemon.service import Daemon

__all__ = ["status_document", "without_spawned"]


async def status_document(daemon: Daemon) -> dict[str, Any]:
    """What the daemon is doing now (docs/daemon.md, "status"): agents, runs in flight, queue, audit, replicas,
    the other ways in (webhooks, A2A, schedules, fleet) and the home's files whose modes are too wide."""
    head = daemon.audit.head or {}
    now = now_ms()
    # Re-read at each request: a chmod after the start shows at once (a dozen stat calls, off the loop).
    file_modes = [message for message, _ in await trio.to_thread.run_sync(mode_problems, daemon.home)]
    doors = daemon.front_doors.view() if daemon.front_doors is not None else {}
    return {
        "version": __version__,
        "pid": os.getpid(),
        "uptime_s": int(time.monotonic() - daemon.started_monotonic),
        "started_at_ms": daemon.started_at_ms,
        "home": str(daemon.home.root),
        "sockets": daemon.socket_paths,
        "shutting_down": daemon.shutting_down,
        "network_isolation": daemon.network_isolation,
        "isolation": daemon.isolation.mode,
        "isolation_detail": daemon.isolation.to_json(),
        "tool_files": daemon.runner.tool_confinement.to_json(),
        "cpu_share": groups.to_json() if (groups := daemon.runner.plans.cpu_groups) else None,
        "agents": {"loaded": sorted(daemon.agents.loaded.agents), "withdrawn": sorted(daemon.agents.loaded.withdrawn),
                   "snapshot": {agent_id: str(path) for agent_id, path in sorted(daemon.agents.loaded.snapshots.items())},
                   "stopped": sorted(daemon.agents.stopped)},
        "rejected": [p.to_json() for p in daemon.agents.loaded.problems],
        "in_flight": [
            {"intent": d.intent_id, "agent": d.agent_id, "elapsed_ms": int((time.monotonic() - d.started) * 1000)}
            for d in daemon.inflight.values()
        ],
        "queued": daemon.scheduler.queued,
        "admitted": daemon.admitted,
        "limits": {
            "max_concurrent": daemon.scheduler.max_concurrent,
            "per_agent": daemon.scheduler.per_agent,
            "queue_max": daemon.scheduler.queue_max,
        },
        "audit": {
            "healthy": daemon.audit.healthy,
            "failure": daemon.audit.failure,
            "head_seq": head.get("seq"),
            "writer_pid": next(iter(daemon.audit.process_ids), None),
            "checkpoint_age_ms": (now - ms_from_iso(head["ts"])) if "ts" in head else None,
            "head": head or None,
        },
        "grants": {
            "problems": [str(p) for p in daemon.grants.current.problems]
            + ([daemon.grants.load_error] if daemon.grants.load_error else []),
        },
        "replicas": daemon.rune.replicas.views(),
        "mcp_servers": daemon.rune.tools.mcp.status(),
        "config": {"needs_restart": list(daemon.config_reload.needs_restart)},
        "file_modes": file_modes,
        **doors,
    }


def without_spawned(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` without the agents made by ``rune@agent-spawn`` (their ids, runs, replicas and servers): what
    a client who does not see every dispatch record is shown, since a spawned agent is its issuer's alone."""
    document["agents"]["loaded"] = [a for a in document["agents"]["loaded"] if not is_spawned_id(a)]
    for key in ("in_flight", "replicas", "mcp_servers"):
        document[key] = [entry for entry in document[key] if not is_spawned_id(entry["agent"])]
    return document
