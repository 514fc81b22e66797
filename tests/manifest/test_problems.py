from pathlib import Path

import pytest

from covenant.errors import CovenantError
from covenant.manifest.problems import ManifestError, Problem


def test_problem_renders_present_parts_only() -> None:
    assert str(Problem(Path("/a/b.toml"), 3, "agent.id", "bad")) == "/a/b.toml:3: agent.id: bad"
    assert str(Problem(Path("/a/b.toml"), None, "agent.id", "bad")) == "/a/b.toml: agent.id: bad"
    assert str(Problem(Path("/a/b.toml"), 7, None, "bad")) == "/a/b.toml:7: bad"
    assert str(Problem(Path("/a/b.toml"), None, None, "bad")) == "/a/b.toml: bad"


def test_problem_json() -> None:
    assert Problem(Path("/x"), 1, "f", "m").to_json() == {"path": "/x", "line": 1, "field": "f", "message": "m"}


def test_manifest_error_carries_problems() -> None:
    problems = [Problem(Path("/x"), 1, "f", "m"), Problem(Path("/x"), 2, None, "n")]
    err = ManifestError(problems)
    assert isinstance(err, CovenantError)
    assert err.code == "bad_manifest" and err.exit_code == 2
    assert err.problems == problems
    assert err.message.startswith("/x:1: f: m") and "1 more" in err.message
    assert err.to_json()["error"]["problems"][1]["line"] == 2


def test_manifest_error_needs_a_problem() -> None:
    with pytest.raises(ValueError):
        ManifestError([])
