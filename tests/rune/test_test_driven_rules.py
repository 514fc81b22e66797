"""The test-driven loop's pure rules: the task, the code in an answer, the verdict, the daemon's check, the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from covenant.daemon.intent_context import IntentContext
from covenant.daemon.test_attempts import _STATE, _Trajectory, checked_outcome
from covenant.manifest.runefile import load_rune_package
from covenant.rune.test_driven import TaskError, extract_code, parse_task
from covenant.rune.trajectories import (
    TrajectoryStore,
    exported_attempts,
    new_trajectory_id,
    read_trajectory,
)
from covenant.tools.test_suite import build_script, judge

SUITE = "import unittest\nclass T(unittest.TestCase):\n    def test_x(self):\n        self.assertTrue(f())\n"


@pytest.mark.parametrize(("text", "field"), [
    ("not json", "not JSON"),
    ("[1]", "JSON object"),
    (json.dumps({"test_suite": SUITE}), "task_description"),
    (json.dumps({"task_description": "f", "test_suite": "  "}), "test_suite"),
    (json.dumps({"task_description": "f", "test_suite": SUITE, "max_attempts": 0}), "max_attempts"),
    (json.dumps({"task_description": "f", "test_suite": SUITE, "max_attempts": True}), "max_attempts"),
    (json.dumps({"task_description": "f", "test_suite": SUITE, "adapter_ids": "a"}), "adapter_ids"),
    (json.dumps({"task_description": "f", "test_suite": SUITE, "adapter_ids": [""]}), "adapter_ids"),
    (json.dumps({"task_description": "f", "test_suite": SUITE, "rm -rf": 1}), "rm -rf"),
])
def test_a_task_that_is_not_one_names_its_field(text: str, field: str) -> None:
    with pytest.raises(TaskError, match=field):
        parse_task(text)


def test_a_task_takes_its_defaults_and_the_first_adapter() -> None:
    task = parse_task(json.dumps({"task_description": "f", "test_suite": SUITE, "adapter_ids": ["a", "b"]}))
    assert (task.task_type, task.max_attempts, task.adapter) == ("function", 3, "a")


def test_the_code_is_the_first_fenced_block_else_the_answer() -> None:
    assert extract_code("Sure:\n```python\ndef f():\n    return 1\n```\nand ```py\nx\n```") == "def f():\n    return 1"
    assert extract_code("def f(): return 1\n") == "def f(): return 1"


def test_the_verdict_needs_tests_that_ran_and_exit_zero_within_limits() -> None:
    ran = "..\n----------------------------------------------------------------------\nRan 2 tests in 0.001s\n\nOK\n"
    assert build_script("def f(): return 1", SUITE).endswith("unittest.main()\n")
    assert "unittest.main()" not in build_script("x = 1", "print('no tests')")
    assert judge("def f(): return 1", SUITE, 0, None, "", ran).tests_passed
    assert not judge("def f(): return 1", SUITE, 0, "timeout", "", ran).tests_passed  # stopped by a limit
    assert not judge("x = 1", "print('Ran 2 tests in 0s')", 0, None, "", ran).tests_passed  # no TestCase at all
    none = judge("def f(): return 1", SUITE, 0, None, "", "")
    assert (none.tests_passed, none.tests_ran, none.test_count) == (False, False, 0)
    failed = judge("def f(): return 0", SUITE, 1, None, "", ran.replace("OK", "FAILED (failures=1)"))
    assert (failed.tests_passed, failed.test_count, failed.tests_ran) == (False, 2, True)


def _context(tmp_path: Path, loop: str) -> IntentContext:
    folder = tmp_path / loop
    folder.mkdir()
    (folder / "Runefile").write_text("name: coder\nversion: 0.1.0\ninstructions: x\ndefault_model: d\n"
                                     f"loop: {loop}\nmodels:\n  model_mapping:\n    d: m\n")
    package = load_rune_package(folder)
    return IntentContext("i-1", "ab" * 32, package.to_agent_spec(), package, 0.0, text="{}")


def test_the_daemon_believes_only_its_own_runs(tmp_path: Path) -> None:
    context = _context(tmp_path, "test-driven")
    assert checked_outcome(context, "ok", "code")[0] == "protocol_error"  # no attempt ran at all
    assert checked_outcome(context, "tests_exhausted", None)[0] == "protocol_error"
    trajectory = context.state[_STATE] = _Trajectory(parse_task(json.dumps({"task_description": "f", "test_suite": SUITE})))
    trajectory.passed_code = "def f(): return 1"
    assert checked_outcome(context, "ok", "what the replica claims") == ("ok", None, "def f(): return 1")
    trajectory.ended = "exhausted"
    assert checked_outcome(context, "tests_exhausted", None) == ("tests_exhausted", None, None)
    assert checked_outcome(context, "timeout", None) == ("timeout", None, None)
    plain = _context(tmp_path, "tools")
    assert checked_outcome(plain, "ok", "hello") == ("ok", None, "hello")


def test_a_trajectory_file_keeps_its_attempts_and_refuses_bad_lines(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    session = new_trajectory_id()
    with pytest.raises(ValueError):
        store.path("coder@local", "../../etc/passwd")
    with pytest.raises(ValueError):
        store.path("..", session)
    store.append("coder@local", session, {"kind": "attempt", "attempt": 1, "ts": "t1"})
    path = store.path("coder@local", session)
    with path.open("ab") as f:
        f.write(b'{"kind": "end", "outc')  # torn by a crash mid-write
    attempts, outcome = read_trajectory(path)
    assert [a["attempt"] for a in attempts] == [1] and outcome is None
    assert exported_attempts(tmp_path, None) == [{"attempt": 1, "ts": "t1", "outcome": None}]
    path.write_bytes(b'not json\n{"kind": "attempt"}\n')
    with pytest.raises(ValueError, match=f"{path}:1"):
        read_trajectory(path)
