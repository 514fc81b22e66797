"""Choose the agent for an intent: explicit id, keyword match, or the default.

Pure functions over the loaded agents; no I/O. Never a silent fallback: a tie
is ``ambiguous``, nothing matching without a configured default is
``no_agent``, and an agent an operator stopped (``covenant stop``) is never
chosen in silence: naming it, or keywords that match only stopped agents, is
``agent_stopped``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path

from covenant.agent_names import AmbiguousRoute, NoAgent, resolve_agent_id
from covenant.errors import CovenantError, ExitCode
from covenant.manifest.model import AgentSpec
from covenant.spawned_ids import is_spawned_id

__all__ = ["NoAgent", "AmbiguousRoute", "AgentStopped", "agent_stopped", "route", "keyword_scores"]


class AgentStopped(CovenantError):
    """The agent was stopped by an operator (``covenant stop``); ``covenant start`` takes it back.

    Details: ``agent``, and ``command`` (``start ID``): the CLI words the hint with the home it was given."""

    code = "agent_stopped"
    exit_code = ExitCode.NO_AGENT
    http_status = 409


def agent_stopped(agent_id: str, why: str = "") -> AgentStopped:
    """The refusal of a dispatch to the stopped ``agent_id``; ``why`` says how it was chosen, when not by name."""
    return AgentStopped(
        f"{why}agent {agent_id} is stopped (`covenant stop`): it takes no dispatches until it is started again "
        f"with `covenant start {agent_id}`",
        agent=agent_id, command=f"start {agent_id}",
    )

_WORD = re.compile(r"\w+(?:[-']\w+)*", re.UNICODE)


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
    stopped: Collection[str] = (),
) -> tuple[AgentSpec, str]:
    """The agent for ``text`` and how it was chosen (``explicit``, ``keywords``, ``default``).

    ``requested`` is a full id (``name@namespace``) or a bare name, resolved by
    :func:`covenant.agent_names.resolve_agent_id` (the rule every command that takes an agent uses). An agent
    made by ``rune@agent-spawn`` is reached by its full id only: a bare name, keywords or the default never
    choose one, so it can neither take a loaded agent's place nor make a request for it ambiguous.

    ``withdrawn`` (id -> manifest path) names agents a rejected edit took away,
    so that asking for one says why it cannot run.

    ``stopped`` (ids) are the agents an operator stopped: keywords choose among the others, and naming one,
    keywords that match stopped agents only, or a stopped ``default_agent`` raise :class:`AgentStopped`.
    """
    if requested is not None:
        agent_id = resolve_agent_id(requested, agents, withdrawn=withdrawn)
        if agent_id in stopped:
            raise agent_stopped(agent_id)
        return agents[agent_id], "explicit"
    scores = keyword_scores(text, _routable(agents))
    if scores and all(agent_id in stopped for agent_id in scores):
        matched = sorted(scores, key=lambda agent_id: (-scores[agent_id], agent_id))  # the one keywords chose first
        raise agent_stopped(matched[0], f"the intent's keywords match only stopped agents ({', '.join(matched)}): ")
    scores = {agent_id: score for agent_id, score in scores.items() if agent_id not in stopped}
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
        if agent.id in stopped:
            raise agent_stopped(agent.id, "no agent's keywords match the intent, so it would go to default_agent; ")
        return agent, "default"
    raise NoAgent(
        "no agent's keywords match the intent and covenant.toml sets no default_agent; "
        "name one with --agent (see `covenant agents list`)"
    )
