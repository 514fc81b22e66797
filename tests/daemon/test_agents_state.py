"""merge_reload is pure: what a reload loads is the fresh scan; a rejected edit withdraws its agent (issue 16)."""

from __future__ import annotations

from pathlib import Path

from covenant.daemon.agents_state import LoadedAgents, merge_reload
from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import Problem
from covenant.manifest.registry import Registry

A, B = Path("/agents/a.toml"), Path("/agents/b.toml")


def _agent(agent_id: str, version: str = "0.1.0") -> AgentSpec:
    return AgentSpec(id=agent_id, name=agent_id.split("@")[0], version=version, runtime="python3",
                     kind="agent.toml", manifest_path=Path("/agents/x.toml"), root=Path("/agents"),
                     entry=Path("/agents/x.py"))


def _scan(valid: dict[Path, AgentSpec], rejected: tuple[Path, ...] = ()) -> Registry:
    return Registry(
        agents={spec.id: spec for spec in valid.values()},
        problems=[Problem(path, 1, None, "parse error") for path in rejected],
        sources={**{path: spec.id for path, spec in valid.items()}, **{path: None for path in rejected}},
    )


def test_a_rejected_edit_withdraws_the_agent_and_keeps_nothing_of_it() -> None:
    before = LoadedAgents.first(_scan({A: _agent("a@local"), B: _agent("b@local")}))
    after, changes = merge_reload(before, _scan({B: _agent("b@local")}, rejected=(A,)))
    assert set(after.agents) == {"b@local"}
    assert after.withdrawn == {"a@local": A}
    assert changes.withdrawn == ["a@local"] and changes.removed == [] and changes.added == []


def test_withdrawn_stays_while_the_file_stays_rejected_and_ends_when_fixed_or_deleted() -> None:
    loaded = LoadedAgents.first(_scan({A: _agent("a@local")}))
    loaded, _ = merge_reload(loaded, _scan({}, rejected=(A,)))
    loaded, changes = merge_reload(loaded, _scan({}, rejected=(A,)))
    assert loaded.withdrawn == {"a@local": A} and changes.withdrawn == []  # reported once, kept listed
    fixed, changes = merge_reload(loaded, _scan({A: _agent("a@local", "0.2.0")}))
    assert fixed.withdrawn == {} and changes.added == ["a@local"] and fixed.agents["a@local"].version == "0.2.0"
    deleted, _ = merge_reload(loaded, _scan({}))
    assert deleted.withdrawn == {} and deleted.agents == {}


def test_another_valid_file_providing_the_id_is_not_a_withdrawal() -> None:
    loaded = LoadedAgents.first(_scan({A: _agent("a@local")}))
    after, changes = merge_reload(loaded, _scan({B: _agent("a@local", "0.3.0")}, rejected=(A,)))
    assert after.withdrawn == {} and changes.withdrawn == [] and changes.changed == ["a@local"]


def test_a_file_that_was_never_valid_withdraws_nothing() -> None:
    loaded = LoadedAgents.first(_scan({}, rejected=(A,)))
    after, changes = merge_reload(loaded, _scan({}, rejected=(A,)))
    assert after.withdrawn == {} and changes.withdrawn == []
