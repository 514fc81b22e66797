"""The registry scan: layout, isolation of bad files, duplicates, symlinks, ownership, load_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from covenant.manifest.problems import ManifestError
from covenant.manifest.registry import check_paths, load_path, scan_agents
from tests.manifest.helpers import VALID_TOML, write_agent, write_rune


def _toml(agent_id: str) -> str:
    return VALID_TOML.replace("demo@local", agent_id)


def _layout(agents: Path) -> None:
    """One of each form: a *.toml, a package folder with agent.toml, a Rune package."""
    write_agent(agents, _toml("flat@local"), filename="flat.toml")
    write_agent(agents / "pkg", _toml("pkg@local"))
    write_rune(agents / "helper")


def test_scan_finds_every_layout(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    _layout(agents)
    registry = scan_agents(agents)
    assert registry.problems == []
    assert sorted(registry.agents) == ["flat@local", "helper@local", "pkg@local"]
    assert registry.sources == {
        agents / "flat.toml": "flat@local",
        agents / "pkg" / "agent.toml": "pkg@local",
        agents / "helper" / "Runefile": "helper@local",
    }
    assert registry.agents["pkg@local"].entry == agents / "pkg" / "main.py"
    assert registry.agents["flat@local"].root == agents
    assert list(registry.rune_packages) == ["helper@local"]
    assert registry.rune_packages["helper@local"].runefile.name == "helper"


def test_hidden_entries_and_other_files_are_ignored(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, _toml("a@local"), filename="a.toml")
    (agents / ".hidden.toml").write_text("not toml [")
    (agents / "README.md").write_text("notes")
    (agents / "empty-dir").mkdir()
    registry = scan_agents(agents)
    assert registry.problems == [] and list(registry.agents) == ["a@local"]
    assert {n.path.name for n in registry.notes} == {"README.md", "empty-dir", "main.py"}  # main.py: a.toml's entry
    assert all(n.message.startswith("info: ignored") for n in registry.notes)


WORKFLOW_FOLDER = """\
name: pipeline
version: 0.1.0
steps:
  - id: first
    agent_ref: local://helper
"""


def test_a_workflow_folder_is_an_agent_and_loads_the_packages_below_it(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    flow = agents / "flow"
    write_rune(flow / "helper")
    write_rune(flow / "broken", "name: [\n")
    (flow / "workflow.yaml").write_text(WORKFLOW_FOLDER)
    (flow / "notes.txt").write_text("x")
    (flow / "stray").mkdir()
    (flow / "helper" / "README.md").write_text("x")
    registry = scan_agents(agents)
    assert set(registry.agents) == {"pipeline@local", "helper@local"}
    assert registry.agents["pipeline@local"].runtime == "workflow"
    assert {p.path.parent.name for p in registry.problems} == {"broken"}  # one bad package hides nothing
    assert {n.path.name for n in registry.notes} == {"notes.txt", "stray", "README.md"}
    assert load_path(flow).id == "pipeline@local"


def test_a_workflow_name_that_is_no_agent_name_is_refused(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    (agents / "flow").mkdir(parents=True)
    (agents / "flow" / "workflow.yaml").write_text(WORKFLOW_FOLDER.replace("name: pipeline", "name: My Pipeline"))
    (problem,) = scan_agents(agents).problems
    assert problem.field == "name" and problem.line == 1 and "lowercase" in problem.message


def test_a_writable_workflow_folder_rejects_the_packages_below_it(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    flow = agents / "flow"
    write_rune(flow / "helper")
    (flow / "workflow.yaml").write_text(WORKFLOW_FOLDER)
    os.chmod(flow, 0o777)
    registry = scan_agents(agents)
    assert registry.agents == {}
    assert all("writable by group or others" in p.message for p in registry.problems)


def test_one_bad_file_never_hides_the_others(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    _layout(agents)
    write_agent(agents, "[agent\n", filename="broken.toml")
    write_agent(agents / "badpkg", _toml("badpkg@local").replace('"off"', '"sometimes"'))
    write_rune(agents / "badrune", "name: [\n")
    registry = scan_agents(agents)
    assert sorted(registry.agents) == ["flat@local", "helper@local", "pkg@local"]
    assert {p.path for p in registry.problems} == {
        agents / "broken.toml",
        agents / "badpkg" / "agent.toml",
        agents / "badrune" / "Runefile",
    }
    assert registry.sources[agents / "broken.toml"] is None
    assert registry.sources[agents / "badpkg" / "agent.toml"] is None
    assert registry.sources[agents / "badrune" / "Runefile"] is None


def test_duplicate_ids_reject_both_files_and_name_each_other(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    first = write_agent(agents, _toml("twin@local"), filename="one.toml")
    second = write_agent(agents / "two", _toml("twin"))  # bare id: the same twin@local
    registry = scan_agents(agents)
    assert "twin@local" not in registry.agents
    by_path = {p.path: p for p in registry.problems}
    assert set(by_path) == {first, second}
    assert str(second) in by_path[first].message and str(first) in by_path[second].message
    assert by_path[first].field == "agent.id" and by_path[first].line == 2
    assert registry.sources == {first: None, second: None}


def test_duplicate_between_runefile_and_toml(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, _toml("helper@local"), filename="helper.toml")
    write_rune(agents / "helper")
    registry = scan_agents(agents)
    assert registry.agents == {} and len(registry.problems) == 2
    rune_problem = next(p for p in registry.problems if p.path.name == "Runefile")
    assert rune_problem.field == "name" and rune_problem.line == 1


def test_missing_agents_dir_is_an_empty_registry_with_one_problem(tmp_path: Path) -> None:
    registry = scan_agents(tmp_path / "nope")
    assert registry.agents == {} and registry.sources == {}
    (problem,) = registry.problems
    assert "does not exist" in problem.message


def test_symlink_leaving_the_agents_dir_is_rejected(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    outside = write_agent(tmp_path / "outside", _toml("evil@local"))
    os.symlink(outside, agents / "evil.toml")
    os.symlink(outside.parent, agents / "evilpkg")
    inside = write_agent(agents / "real", _toml("real@local"))
    os.symlink(inside, agents / "alias.toml.link")  # not *.toml: ignored
    registry = scan_agents(agents)
    assert list(registry.agents) == ["real@local"]
    assert {p.path for p in registry.problems} == {agents / "evil.toml", agents / "evilpkg" / "agent.toml"}
    assert all("outside the agents folder" in p.message for p in registry.problems)


def test_symlink_staying_inside_is_accepted(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    target = write_agent(agents / "store", _toml("kept@local"), filename="kept.toml")
    os.symlink(target, agents / "kept.toml")
    (agents / "main.py").write_text("")  # entry resolves against the folder the manifest was found in
    registry = scan_agents(agents)
    assert registry.problems == [] and "kept@local" in registry.agents


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646])
def test_manifest_writable_by_others_is_rejected(tmp_path: Path, mode: int) -> None:
    agents = tmp_path / "agents"
    path = write_agent(agents / "pkg", _toml("loose@local"))
    os.chmod(path, mode)
    registry = scan_agents(agents)
    assert registry.agents == {}
    (problem,) = registry.problems
    assert "writable by group or others" in problem.message and "chmod go-w" in problem.message


def test_entry_writable_by_others_is_rejected(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    write_agent(agents / "pkg", _toml("loose@local"))
    os.chmod(agents / "pkg" / "main.py", 0o777)
    (problem,) = scan_agents(agents).problems
    assert problem.path == agents / "pkg" / "main.py" and "the entry" in problem.message


def test_rune_tool_module_writable_by_others_is_rejected(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    write_rune(agents / "helper")
    os.chmod(agents / "helper" / "tools" / "search_kb.py", 0o666)
    registry = scan_agents(agents)
    assert registry.agents == {} and registry.problems[0].path.name == "search_kb.py"


def test_package_folder_and_agents_dir_writable_by_others(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    write_agent(agents / "pkg", _toml("a@local"))
    os.chmod(agents / "pkg", 0o777)
    (problem,) = scan_agents(agents).problems
    assert "the package folder" in problem.message
    os.chmod(agents / "pkg", 0o755)
    os.chmod(agents, 0o777)
    registry = scan_agents(agents)
    assert registry.agents == {} and "the agents folder" in registry.problems[0].message


def test_manifest_owned_by_another_user_is_rejected(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    agents = tmp_path / "agents"
    path = write_agent(agents / "pkg", _toml("theirs@local"))
    os.chown(path, 65534, 65534)
    (problem,) = scan_agents(agents).problems
    assert "owned by uid 65534" in problem.message


def test_load_path_accepts_file_package_and_rune_folder(tmp_path: Path) -> None:
    flat = write_agent(tmp_path / "a", _toml("flat@local"), filename="flat.toml")
    assert load_path(flat).id == "flat@local"
    write_agent(tmp_path / "b", _toml("pkg@local"))
    assert load_path(tmp_path / "b").id == "pkg@local"
    write_rune(tmp_path / "c")
    spec = load_path(tmp_path / "c")
    assert spec.id == "helper@local" and spec.runtime == "rune"
    assert load_path(tmp_path / "c" / "Runefile").id == "helper@local"


def test_load_path_failures(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestError, match="holds no agent.toml, Runefile or workflow.yaml"):
        load_path(tmp_path / "empty")
    with pytest.raises(ManifestError, match="does not exist"):
        load_path(tmp_path / "absent.toml")
    path = write_agent(tmp_path / "loose", _toml("loose@local"))
    os.chmod(path, 0o666)
    with pytest.raises(ManifestError, match="writable by group or others"):
        load_path(path)


def test_check_paths_mixes_files_packages_and_folders(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    _layout(agents)
    extra = write_agent(tmp_path / "extra", _toml("flat@local"), filename="dup.toml")
    registry = check_paths([agents, extra, agents / "helper", tmp_path / "ghost.toml"])
    assert "pkg@local" in registry.agents and "flat@local" not in registry.agents  # duplicate across PATHs
    messages = [str(p) for p in registry.problems]
    assert any("ghost.toml: does not exist" in m for m in messages)
    assert any("duplicate agent id 'flat@local'" in m for m in messages)
    assert any("duplicate agent id 'helper@local'" in m for m in messages)  # helper named twice
