"""merge_reload is pure: what a reload loads is the fresh scan (with its snapshots); a rejected edit with no snapshot
withdraws its agent (issue 16); `changed` goes by content when both versions have a digest (issue 39)."""

from __future__ import annotations

from pathlib import Path

from covenant.daemon.agents_state import LoadedAgents, merge_reload
from covenant.daemon.registry_scan import Scan
from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import Problem
from covenant.manifest.registry import Registry

A, B = Path("/agents/a.toml"), Path("/agents/b.toml")


def _agent(agent_id: str, version: str = "0.1.0") -> AgentSpec:
    return AgentSpec(id=agent_id, name=agent_id.split("@")[0], version=version, runtime="python3",
                     kind="agent.toml", manifest_path=Path("/agents/x.toml"), root=Path("/agents"),
                     entry=Path("/agents/x.py"))


def _scan(valid: dict[Path, AgentSpec], rejected: tuple[Path, ...] = (), *, snapshots: dict[str, Path] | None = None,
          digests: dict[str, str] | None = None) -> Scan:
    return Scan(Registry(
        agents={spec.id: spec for spec in valid.values()},
        problems=[Problem(path, 1, None, "parse error") for path in rejected],
        sources={**{path: spec.id for path, spec in valid.items()}, **{path: None for path in rejected}},
    ), snapshots or {}, digests or {})


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


def test_an_agent_on_its_snapshot_is_neither_withdrawn_nor_changed_and_is_reported_once() -> None:
    loaded = LoadedAgents.first(_scan({A: _agent("a@local")}, digests={"a@local": "d1"}))
    from_snapshot = _agent("a@local").model_copy(update={"root": Path("/state/snapshots/d1/files")})
    scan = _scan({}, rejected=(A,), snapshots={"a@local": A}, digests={"a@local": "d1"})
    scan.registry.agents["a@local"] = from_snapshot  # as registry_scan adds it: its file (A) stays rejected
    after, changes = merge_reload(loaded, scan)
    assert after.agents == {"a@local": from_snapshot} and after.withdrawn == {}
    assert changes.withdrawn == [] and changes.changed == [] and changes.removed == []
    assert changes.snapshot == ["a@local"] and after.state_of("a@local") == {"state": "snapshot", "waiting_on": str(A)}
    again, changes = merge_reload(after, scan)
    assert changes.snapshot == [] and again.snapshots == {"a@local": A}


def test_changed_goes_by_content_when_both_versions_have_a_digest() -> None:
    loaded = LoadedAgents.first(_scan({A: _agent("a@local")}, digests={"a@local": "d1"}))
    _, changes = merge_reload(loaded, _scan({A: _agent("a@local")}, digests={"a@local": "d2"}))
    assert changes.changed == ["a@local"]  # the same manifest, an edited tool file or skill
    _, changes = merge_reload(loaded, _scan({A: _agent("a@local")}, digests={"a@local": "d1"}))
    assert changes.changed == []
