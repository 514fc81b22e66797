"""The agents a command's AGENT is resolved against, and the resolution itself.

What the running daemon has loaded (with the agents made by ``rune@agent-spawn`` it shows this user and
the ids a rejected edit withdrew), else a scan of the home's agents folder. A name is resolved by
:func:`covenant.agent_names.resolve_agent_id`, the rule ``dispatch --agent`` follows in the daemon, so
``echo`` means ``echo@local`` to every command as it does to ``dispatch``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from covenant.agent_names import NoAgent, resolve_agent_id, resolve_recorded_agent_id
from covenant.cli._common import ask_daemon
from covenant.home import Home
from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import Problem
from covenant.manifest.registry import Registry

__all__ = ["KnownAgents", "known_agents", "resolve_agent", "resolve_recorded_agent"]


class KnownAgents(NamedTuple):
    registry: Registry
    """The valid agents (spawned ones included when the daemon shows them), problems and notes."""
    spawned: list[dict[str, Any]]
    """``GET /v1/agents``'s ``spawned`` entries; empty without a daemon."""
    withdrawn: list[str]
    """Ids whose manifest a reload rejected (the daemon's; empty without one)."""
    states: dict[str, dict[str, Any]] = {}
    """Agent id -> its ``state`` in the daemon (``loaded``, ``snapshot`` with ``waiting_on``) and whether it is
    ``stopped`` (``covenant stop``); empty without one."""

    def ids(self) -> list[str]:
        """Every id a name may mean: the loaded agents and the withdrawn ones (their lines and records exist)."""
        return [*self.registry.agents, *self.withdrawn]


_STATE_KEYS = ("state", "waiting_on", "stopped")
"""What ``GET /v1/agents`` says of an agent beyond its manifest."""


def _problem(doc: dict[str, Any]) -> Problem:
    return Problem(Path(doc["path"]), doc.get("line"), doc.get("field"), doc["message"])


def known_agents(home: Home) -> KnownAgents:
    """What the running daemon has loaded; without a daemon, a scan of the agents folder."""
    loaded = ask_daemon(home, "/v1/agents")
    if loaded is None:
        from covenant.config import load_config
        from covenant.manifest.limits import ManifestLimits
        from covenant.manifest.registry import scan_agents
        from covenant.tools.refuse import enforce_unavailable_policy

        config = load_config(home)
        registry = scan_agents(home.agents_dir, ManifestLimits.from_config(config.runtime))
        return KnownAgents(enforce_unavailable_policy(registry, config), [], [])
    agents = [AgentSpec.model_validate(doc, strict=False) for doc in loaded["agents"]]
    registry = Registry(agents={a.id: a for a in agents}, problems=[_problem(p) for p in loaded["problems"]],
                        notes=[_problem(n) for n in loaded.get("notes", [])])
    states = {doc["id"]: {key: doc[key] for key in _STATE_KEYS if key in doc} for doc in loaded["agents"]}
    return KnownAgents(registry, loaded.get("spawned", []), list(loaded.get("withdrawn", [])), states)


def resolve_agent(home: Home, name: str) -> str:
    """The full id ``name`` means among the :func:`known_agents`; NoAgent or AmbiguousRoute (exit 6) otherwise."""
    return resolve_agent_id(name, known_agents(home).ids())


def resolve_recorded_agent(home: Home, name: str) -> tuple[str, NoAgent | None]:
    """:func:`covenant.agent_names.resolve_recorded_agent_id` among the :func:`known_agents`."""
    return resolve_recorded_agent_id(name, known_agents(home).ids())
