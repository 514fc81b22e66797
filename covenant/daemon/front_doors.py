"""The ways in besides the control socket, as ``covenant status`` shows them, and the names they give
that no loaded agent answers to.

The webhook and A2A listeners, the schedules and the fleet are read from the live objects that serve
them (not from a copy of covenant.toml taken at start), so what status shows is what is served now.
A ``[[schedules]]`` entry, a ``[[webhooks.routes]]`` route or an ``[a2a] expose`` name that names no
loaded agent is refused each time it is used; the daemon says so once at start and after each reload
(a log warning each), and status lists them until they are fixed.

The daemon cannot see the fleet's NATS connection: what it knows is whether ``[fleet]`` is set and when
a ``covenant fleet`` process last asked for its status (it asks every second, sending
``Covenant-Client: fleet``; only a peer allowed administrative calls is believed).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from covenant.daemon.server import Peer
from covenant.fleet.config import FleetConfig, default_host

if TYPE_CHECKING:
    from covenant.a2a.server import A2AApp
    from covenant.triggers.schedules import ScheduleRunner
    from covenant.triggers.webhooks import WebhookApp

__all__ = ["FrontDoors", "CLIENT_HEADER", "FLEET_CLIENT", "FLEET_FRESH_S"]

log = logging.getLogger("covenant.daemon")

CLIENT_HEADER = b"covenant-client"
FLEET_CLIENT = b"fleet"
FLEET_FRESH_S = 10.0
"""A fleet process that asked within this long is shown as connected (it asks every second)."""


@dataclass
class _FleetContact:
    pid: int
    at: float
    """time.monotonic() of its last status request."""


class FrontDoors:
    """The webhook and A2A apps, the schedule runner and ``[fleet]`` of one daemon run.

    ``has_agent(name)`` says whether a loaded agent answers to ``name`` (an id or a bare name), as a
    dispatch naming it would be routed (:meth:`covenant.daemon.live_agents.LiveAgents.find`).
    """

    def __init__(self, *, config_path: str, webhooks: WebhookApp, a2a: A2AApp, schedules: ScheduleRunner,
                 fleet: FleetConfig, has_agent: Callable[[str], bool], listening: dict[str, str]) -> None:
        self.config_path = config_path
        self.listening = listening
        """Listener name (``webhooks``, ``a2a``) -> the HOST:PORT its socket is bound to; absent when off."""
        self.webhooks = webhooks
        self.a2a = a2a
        self.schedules = schedules
        self.fleet = fleet
        self.has_agent = has_agent
        self._fleet_contact: _FleetContact | None = None

    # -- names that lead nowhere ---------------------------------------------------------------

    def unknown_names(self) -> list[str]:
        """One message per schedule, webhook route or exposed A2A name that names no loaded agent."""
        where = self.config_path
        found = []
        for schedule in self.schedules.schedules:
            if not self.has_agent(schedule.agent):
                found.append(f"{where}: [[schedules]] {schedule.name!r}: agent = {schedule.agent!r} names no loaded "
                             "agent; each firing is refused (no_agent) until one is loaded")
        for route in self.webhooks.config.routes:
            if not self.has_agent(route.agent):
                found.append(f"{where}: [[webhooks.routes]] {route.path}: agent = {route.agent!r} names no loaded "
                             "agent; its requests are refused (no_agent) until one is loaded")
        for name in self.a2a.config.expose:
            if self.a2a.agents(name) is None:
                found.append(f"{where}: [a2a] expose: {name!r} names no loaded agent; it is not served (404) and "
                             "is left out of the agent cards until one is loaded")
        return found

    def warn_unknown_names(self) -> None:
        """Log each name that leads nowhere (at start and after each reload)."""
        for message in self.unknown_names():
            log.warning("a name in covenant.toml leads to no agent", extra={"problem": message})

    # -- the fleet process -----------------------------------------------------------------------

    def status_asked(self, peer: Peer | None, headers: list[tuple[bytes, bytes]]) -> None:
        """Note a status request; one from ``covenant fleet`` (by its header, from an admin peer) is its contact."""
        if peer is None or peer.uid not in (0, os.getuid()):
            return
        if any(name.lower() == CLIENT_HEADER and value == FLEET_CLIENT for name, value in headers):
            self._fleet_contact = _FleetContact(peer.pid, time.monotonic())

    def _fleet_view(self) -> dict[str, Any]:
        contact = self._fleet_contact
        process = None
        if contact is not None:
            ago = time.monotonic() - contact.at
            process = {"pid": contact.pid, "last_seen_s": round(ago, 1), "connected": ago <= FLEET_FRESH_S}
        host = None
        if self.fleet.enabled:
            host = self.fleet.host or default_host()
        return {"configured": self.fleet.enabled, "host": host, "servers": len(self.fleet.servers), "process": process}

    # -- the status document ---------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """``webhooks``, ``a2a``, ``schedules`` and ``fleet`` of the status document, and ``unknown_names``."""
        webhooks = self.webhooks.config
        a2a = self.a2a.config
        plans = self.schedules.view()
        upcoming = min(plans, key=lambda p: p["next_ms"], default=None)
        return {
            "webhooks": {"listen": self.listening.get("webhooks"),
                         "routes": [{"path": r.path, "agent": r.agent} for r in webhooks.routes]},
            "a2a": {"listen": self.listening.get("a2a"), "url": a2a.base_url() if "a2a" in self.listening else None,
                    "expose": list(a2a.expose), "clients": len(self.a2a.clients)},
            "schedules": {
                "count": len(plans),
                "next": None if upcoming is None else {
                    "name": upcoming["name"], "agent": upcoming["agent"], "at_ms": upcoming["next_ms"]},
            },
            "fleet": self._fleet_view(),
            "unknown_names": self.unknown_names(),
        }
