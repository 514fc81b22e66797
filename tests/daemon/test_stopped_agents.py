"""The list of stopped agents on disk: written whole and durable, read back, a foreign file refused by name."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from covenant.daemon.stopped_agents import StoppedAgents
from covenant.errors import ConfigError


def test_saved_entries_are_read_back_and_only_adopted_ones_count(tmp_path: Path) -> None:
    path = tmp_path / "state" / "stopped-agents.json"
    stopped = StoppedAgents(path)
    stopped.load()  # no file: nothing is stopped
    assert list(stopped) == []
    entries = stopped.with_stopped("echo@local", 1_700_000_000_000, 0)
    stopped.save(entries)
    assert "echo@local" not in stopped  # saved, not yet adopted
    stopped.adopt(entries)
    assert "echo@local" in stopped and stopped.get("echo@local") == {"at_ms": 1_700_000_000_000, "by_uid": 0}
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(path.parent).st_mode & 0o777 == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["stopped-agents.json"]  # no temp file left behind

    again = StoppedAgents(path)
    again.load()
    assert again.entries == {"echo@local": {"at_ms": 1_700_000_000_000, "by_uid": 0}}
    again.save(again.without("echo@local"))
    assert json.loads(path.read_text()) == {"agents": {}, "version": 1}


@pytest.mark.parametrize("content", [
    b"{not json", b"\xff\xfe", b"[]", b'{"agents": []}', b'{"agents": {"a@local": {}}}',
    b'{"agents": {"a@local": {"at_ms": 1.5}}}', b'{"agents": {"a@local": {"at_ms": 1, "by_uid": "root"}}}',
    b'{"agents": {"a@local": {"at_ms": true}}}',
])
def test_a_file_that_is_not_covenants_is_refused_naming_it(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "stopped-agents.json"
    path.write_bytes(content)
    stopped = StoppedAgents(path)
    with pytest.raises(ConfigError) as refused:
        stopped.load()
    assert str(path) in refused.value.message and "move it aside" in refused.value.message
    assert stopped.entries == {}
