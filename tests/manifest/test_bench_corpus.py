"""The benchmark's corpus: all 100 broken manifests are reported, with file and field (or line)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from covenant.manifest.registry import scan_agents
from tests.conftest import REPO_ROOT


def _bench_module():
    spec = importlib.util.spec_from_file_location("agents_check_bench", REPO_ROOT / "bench" / "agents_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_all_100_problems_are_reported_with_file_and_field(tmp_path: Path) -> None:
    bench = _bench_module()
    assert len({name for name, *_ in bench.mutations()}) == 100
    broken = bench.generate(tmp_path, valid=200, packages=20)
    registry = scan_agents(tmp_path)
    assert len(registry.agents) == 200
    by_path: dict[Path, list] = {}
    for problem in registry.problems:
        by_path.setdefault(problem.path, []).append(problem)
    assert set(by_path) == set(broken)
    for path, field in broken.items():
        problems = by_path[path]
        if field is None:
            assert all(p.field is None and p.message.startswith("parse error") for p in problems), problems
        else:
            assert [p.field for p in problems] == [field], problems
        assert all(p.line is not None or p.field is not None for p in problems), problems
    assert all(registry.sources[path] is None for path in broken)
