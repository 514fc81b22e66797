"""Routing is pure: explicit id, keyword score, default, and never a silent fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from covenant.daemon.routing import AmbiguousRoute, NoAgent, keyword_scores, route
from covenant.manifest.model import AgentSpec


def _agent(agent_id: str, *keywords: str) -> AgentSpec:
    return AgentSpec(
        id=agent_id,
        name=agent_id.split("@")[0],
        version="0.1.0",
        runtime="python3",
        kind="agent.toml",
        manifest_path=Path("/x/agent.toml"),
        root=Path("/x"),
        entry=Path("/x/main.py"),
        keywords=keywords,
    )


AGENTS = {
    "count@local": _agent("count@local", "count", "words", "word count"),
    "calc@local": _agent("calc@local", "calculate", "sum"),
    "search@local": _agent("search@local", "search", "find"),
}


def test_explicit_agent_wins_over_keywords() -> None:
    agent, how = route("calculate 1+1", AGENTS, requested="search@local")
    assert (agent.id, how) == ("search@local", "explicit")


def test_explicit_unknown_agent_is_no_agent() -> None:
    with pytest.raises(NoAgent, match="nope@local"):
        route("anything", AGENTS, requested="nope@local")


def test_most_whole_word_matches_wins() -> None:
    agent, how = route("please count the words, the word count matters", AGENTS)
    assert (agent.id, how) == ("count@local", "keywords")


def test_keywords_match_whole_words_only() -> None:
    # "summary" contains "sum" and "finder" contains "find": neither is a whole-word match.
    assert keyword_scores("a summary for the finder", AGENTS) == {}


def test_matching_is_case_insensitive() -> None:
    assert keyword_scores("CALCULATE this", AGENTS) == {"calc@local": 1}


def test_tie_is_ambiguous_and_names_candidates() -> None:
    with pytest.raises(AmbiguousRoute) as info:
        route("search and calculate", AGENTS)
    assert info.value.details["candidates"] == ["calc@local", "search@local"]
    assert info.value.http_status == 409


def test_no_match_goes_to_default_agent() -> None:
    agent, how = route("hello there", AGENTS, default_agent="calc@local")
    assert (agent.id, how) == ("calc@local", "default")


def test_no_match_without_default_is_no_agent() -> None:
    with pytest.raises(NoAgent, match="default_agent"):
        route("hello there", AGENTS)


def test_default_agent_not_loaded_is_no_agent_not_fallback() -> None:
    with pytest.raises(NoAgent, match="gone@local"):
        route("hello there", AGENTS, default_agent="gone@local")


def test_bare_name_selects_the_one_agent_of_that_name() -> None:
    agent, how = route("anything", AGENTS, requested="calc")
    assert (agent.id, how) == ("calc@local", "explicit")


def test_bare_name_in_two_namespaces_is_ambiguous_naming_both() -> None:
    agents = {**AGENTS, "calc@team": _agent("calc@team", "calculate")}
    with pytest.raises(AmbiguousRoute) as raised:
        route("anything", agents, requested="calc")
    assert raised.value.details["candidates"] == ["calc@local", "calc@team"]
    assert "calc@local, calc@team" in raised.value.message


def test_bare_name_matches_whole_names_only() -> None:
    with pytest.raises(NoAgent, match="'cal'"):
        route("anything", AGENTS, requested="cal")


def test_an_unknown_name_is_named_with_the_closest_and_the_loaded_ids() -> None:
    from covenant.agent_names import resolve_agent_id

    ids = ["count@local", "calc@local", "calc@team", "helper@spawned-0123456789ab"]
    with pytest.raises(NoAgent) as raised:
        resolve_agent_id("cout", ids)
    assert raised.value.message == ("no agent with id 'cout' is loaded (did you mean count@local? loaded: calc@local, "
                                    "calc@team, count@local; `covenant agents list` shows them)")
    assert raised.value.details == {"agent": "cout"} and raised.value.exit_code == 6
    # The namespace says nothing (every id ends in @local): "ghost@local" is close to no one.
    with pytest.raises(NoAgent, match=r"'ghost@local' is loaded \(loaded: calc@local"):
        resolve_agent_id("ghost@local", ids)
    assert resolve_agent_id("helper@spawned-0123456789ab", ids) == "helper@spawned-0123456789ab"
    with pytest.raises(NoAgent, match="'helper' is loaded"):  # a spawned agent: by its full id only
        resolve_agent_id("helper", ids)


def test_a_withdrawn_agent_is_named_by_its_bare_name_too() -> None:
    from covenant.agent_names import resolve_agent_id

    with pytest.raises(NoAgent, match=r"agent 'first@local' is withdrawn: its manifest /a/agent.toml was rejected"):
        resolve_agent_id("first", ["count@local"], withdrawn={"first@local": Path("/a/agent.toml")})


def test_records_outlive_their_agent_by_full_id_only() -> None:
    from covenant.agent_names import resolve_recorded_agent_id

    assert resolve_recorded_agent_id("count", ["count@local"]) == ("count@local", None)
    agent_id, unknown = resolve_recorded_agent_id("gone@local", ["count@local"])
    assert agent_id == "gone@local" and isinstance(unknown, NoAgent)
    with pytest.raises(NoAgent):
        resolve_recorded_agent_id("gone", ["count@local"])


def test_an_id_listed_twice_is_one_agent_not_an_ambiguous_name() -> None:
    """`sessions verify NAME` lists the loaded agents and those with session folders: the same id twice."""
    from covenant.agent_names import resolve_agent_id

    assert resolve_agent_id("chat", ["chat@local", "chat@local"]) == "chat@local"


def test_a_stopped_agent_is_never_chosen_in_silence() -> None:
    """Keywords choose among running agents; naming a stopped one, keywords that match only stopped ones, or a
    stopped default_agent are ``agent_stopped`` (exit 6, HTTP 409) naming the command that starts it."""
    from covenant.daemon.routing import AgentStopped

    stopped = {"count@local"}
    with pytest.raises(AgentStopped) as named:
        route("anything", AGENTS, requested="count", stopped=stopped)
    assert (named.value.exit_code, named.value.http_status) == (6, 409)
    assert named.value.details == {"agent": "count@local", "command": "start count@local"}
    assert "`covenant start count@local`" in named.value.message
    with pytest.raises(AgentStopped, match=r"keywords match only stopped agents \(count@local\)"):
        route("count the words", AGENTS, stopped=stopped)
    # A running agent that also matches is chosen, though the stopped one scores higher.
    agent, how = route("count the words and find them", AGENTS, stopped=stopped)
    assert (agent.id, how) == ("search@local", "keywords")
    with pytest.raises(AgentStopped, match="default_agent; agent count@local is stopped"):
        route("nothing matches", AGENTS, default_agent="count@local", stopped=stopped)
    # Two stopped matches: the one keywords would have chosen is named first, and in the command.
    with pytest.raises(AgentStopped, match=r"only stopped agents \(count@local, calc@local\)") as both:
        route("count words sum", AGENTS, stopped={"count@local", "calc@local"})
    assert both.value.details["command"] == "start count@local"
    assert route("count words", AGENTS, stopped=set())[0].id == "count@local"
