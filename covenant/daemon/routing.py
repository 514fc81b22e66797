"""Choose the agent for an intent: explicit id, keyword match, or the default.

Pure functions over the loaded agents; no I/O. Never a silent fallback: a tie
is ``ambiguous`` and nothing matching without a configured default is
``no_agent``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from covenant.errors import CovenantError, ExitCode
from covenant.manifest.model import AgentSpec
from covenant.spawned_ids import is_spawned_id

__all__ = ["NoAgent", "AmbiguousRoute", "route", "keyword_scores"]

_WORD = re.compile(r"\w+(?:[-']\w+)*", re.UNICODE)


class NoAgent(CovenantError):
    code = "no_agent"
    exit_code = ExitCode.NO_AGENT
    http_status = 404


class AmbiguousRoute(CovenantError):
    code = "ambiguous"
    exit_code = ExitCode.NO_AGENT
    http_status = 409


def _words(text: str) -> list[str]:
    return [w.casefold() for w in _WORD.findall(text)]


def keyword_scores(text: str, agents: Mapping[str, AgentSpec]) -> dict[str, int]:
    """Whole-word keyword matches per agent (agents with no match are left out).

    A keyword may span several words ("word count"); it matches as a whole
    phrase, never as a substring of a longer word.
    """
    words = _words(text)
    joined = f" {' '.join(words)} "
    scores: dict[str, int] = {}
    for agent_id, agent in agents.items():
        score = 0
        for keyword in agent.keywords:
            phrase = " ".join(_words(keyword))
            if phrase:
                score += joined.count(f" {phrase} ")
        if score:
            scores[agent_id] = score
    return scores


def _by_bare_name(name: str, agents: Mapping[str, AgentSpec]) -> AgentSpec | None:
    """The one agent whose id is ``name@…``; ``ambiguous`` when several namespaces have it."""
    candidates = sorted(agent_id for agent_id in agents if agent_id.partition("@")[0] == name)
    if len(candidates) > 1:
        raise AmbiguousRoute(
            f"{name!r} names {len(candidates)} agents ({', '.join(candidates)}); give the full id with --agent",
            candidates=candidates,
        )
    return agents[candidates[0]] if candidates else None


def _routable(agents: Mapping[str, AgentSpec]) -> Mapping[str, AgentSpec]:
    """The agents a bare name or keywords may choose: every one but the spawned."""
    if not any(is_spawned_id(agent_id) for agent_id in agents):
        return agents
    return {agent_id: agent for agent_id, agent in agents.items() if not is_spawned_id(agent_id)}


def route(
    text: str,
    agents: Mapping[str, AgentSpec],
    *,
    requested: str | None = None,
    default_agent: str | None = None,
    withdrawn: Mapping[str, Path] | None = None,
) -> tuple[AgentSpec, str]:
    """The agent for ``text`` and how it was chosen (``explicit``, ``keywords``, ``default``).

    ``requested`` is a full id (``name@namespace``) or a bare name, which
    selects the one loaded agent of that name in any namespace. An agent made by ``rune@agent-spawn`` is
    reached by its full id only: a bare name, keywords or the default never choose one, so it can neither
    take a loaded agent's place nor make a request for it ambiguous.

    ``withdrawn`` (id -> manifest path) names agents a rejected edit took away,
    so that asking for one says why it cannot run.
    """
    if requested is not None:
        agent = agents.get(requested)
        if agent is None and withdrawn and requested in withdrawn:
            raise NoAgent(
                f"agent {requested!r} is withdrawn: its manifest {withdrawn[requested]} was rejected at the "
                "last reload; fix it (`covenant agents check` names the problem), then run `covenant reload`",
                agent=requested,
            )
        if agent is None and "@" not in requested:
            agent = _by_bare_name(requested, _routable(agents))
        if agent is None:
            raise NoAgent(
                f"no agent with id {requested!r} is loaded (see `covenant agents list`)",
                agent=requested,
            )
        return agent, "explicit"
    scores = keyword_scores(text, _routable(agents))
    if scores:
        best = max(scores.values())
        winners = sorted(agent_id for agent_id, score in scores.items() if score == best)
        if len(winners) > 1:
            raise AmbiguousRoute(
                f"the intent matches {len(winners)} agents equally ({', '.join(winners)}); "
                "name one with --agent",
                candidates=winners,
            )
        return agents[winners[0]], "keywords"
    if default_agent:
        agent = None if is_spawned_id(default_agent) else agents.get(default_agent)
        if agent is None:
            raise NoAgent(
                f"no agent's keywords match, and default_agent {default_agent!r} from covenant.toml "
                "is not loaded",
                agent=default_agent,
            )
        return agent, "default"
    raise NoAgent(
        "no agent's keywords match the intent and covenant.toml sets no default_agent; "
        "name one with --agent (see `covenant agents list`)"
    )
