"""Parser hardening: every hostile file is one rejected manifest, found fast, with a clear problem."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from covenant.home import Home
from covenant.manifest._yamlio import MAX_YAML_ALIASES, yaml_structure_problem
from covenant.manifest.limits import ManifestLimits, read_capped
from covenant.manifest.problems import ManifestError
from covenant.manifest.registry import check_paths, scan_agents
from covenant.manifest.runefile import load_rune_package
from tests.manifest.helpers import VALID_RUNEFILE, write_rune
from tests.manifest.hostile import EXPECTED, problem_name, write_hostile


def test_the_registry_scan_rejects_each_hostile_file_alone(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    write_hostile(agents)
    registry = scan_agents(agents)
    assert list(registry.agents) == ["good@local"]
    by_case: dict[str, list[str]] = {}
    for problem in registry.problems:
        by_case.setdefault(problem_name(problem.path, agents), []).append(problem.message)
    assert set(by_case) == set(EXPECTED)
    for case, fragment in EXPECTED.items():
        assert any(fragment in message for message in by_case[case]), (case, by_case[case])


def test_agents_check_on_hostile_files_finishes_fast_and_names_each_file(home: Home) -> None:
    agents = home.root / "agents"
    write_hostile(agents)
    env = {**os.environ, "COVENANT_HOME": str(home.root), "COVENANT_SOCKET": str(home.root / "none.sock")}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "covenant", "agents", "check", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["agents"] == ["good@local"]
    assert {problem_name(Path(p["path"]), agents) for p in data["problems"]} == set(EXPECTED)
    assert elapsed < 30, f"agents check took {elapsed:.1f} s"  # was > 30 s on one deep file before the bounds


def test_the_size_cap_is_checked_before_reading_and_configurable(tmp_path: Path) -> None:
    folder = write_rune(tmp_path / "pkg", VALID_RUNEFILE + "# " + "x" * 5000 + "\n")
    with pytest.raises(ManifestError) as info:
        load_rune_package(folder, ManifestLimits(max_bytes=4096))
    (problem,) = info.value.problems
    assert problem.path == folder / "Runefile" and "over the limit of 4096 bytes" in problem.message
    assert "max_manifest_bytes" in problem.message
    assert load_rune_package(folder).runefile.name == "helper"  # under the default 1 MiB
    assert check_paths([folder], ManifestLimits(max_bytes=4096)).problems[0].path == folder / "Runefile"
    with pytest.raises(OSError):
        read_capped(tmp_path, 4096)  # a directory is not a manifest


def test_a_few_aliases_are_fine_and_many_are_refused() -> None:
    few = "base: &b {x: 1}\none: *b\ntwo: *b\n"
    assert yaml_structure_problem(few) is None
    many = "base: &b 1\nlist: [" + ", ".join(["*b"] * (MAX_YAML_ALIASES + 1)) + "]\n"
    line, message = yaml_structure_problem(many)
    assert line == 2 and f"more than {MAX_YAML_ALIASES} YAML aliases" in message


def test_the_alias_bomb_is_refused_without_expanding_it(tmp_path: Path) -> None:
    from tests.manifest.hostile import alias_bomb

    started = time.process_time()
    folder = tmp_path / "bomb"
    folder.mkdir()
    (folder / "Runefile").write_text(alias_bomb())
    with pytest.raises(ManifestError) as info:
        load_rune_package(folder)
    assert "alias bomb" in info.value.problems[0].message and info.value.problems[0].line is not None
    assert time.process_time() - started < 10  # expanded, it is 387 million strings
