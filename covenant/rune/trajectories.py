"""Trajectories of the test-driven loop: one JSON line per attempt, kept for training.

``<home>/state/trajectories/<agent id>/<session id>.jsonl`` (file 0600, folders
0700, owned by the daemon; agent uids cannot read them). The daemon appends
one ``attempt`` line as soon as it has run an attempt's code with the test
suite, and one ``end`` line (``outcome`` ``success`` or ``exhausted``) when the
loop stops, so the attempts of a run that crashes or times out are kept too.
``covenant sessions export --trajectories`` reads them.

An attempt line holds ``session_id`` (a UUID4 the daemon made), ``attempt``
(1, 2, …), the seven per-attempt fields of the agent API (``generated_code``,
``stdout``, ``stderr``, ``exit_code``, ``tests_passed``, ``test_count``,
``tests_ran``), ``task_description``, ``task_type``, ``adapter_ids``, ``ts``
(ISO 8601 UTC), and ``agent`` and ``intent``.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

from covenant.durable import fsync_dir, write_all

__all__ = ["ATTEMPT_FIELDS", "TrajectoryStore", "exported_attempts", "new_trajectory_id", "read_trajectory"]

ATTEMPT_FIELDS = ("generated_code", "stdout", "stderr", "exit_code", "tests_passed", "test_count", "tests_ran")
"""What the agent API records of each attempt (its ``RuneState``)."""

_UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def new_trajectory_id() -> str:
    return str(uuid.uuid4())


class TrajectoryStore:
    """Appends to ``<root>/<agent id>/<session id>.jsonl``; blocking (the daemon calls it in a worker thread)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, agent_id: str, session_id: str) -> Path:
        if not _UUID4.match(session_id):
            raise ValueError(f"trajectory session id {session_id!r} is not a UUID4")
        if "/" in agent_id or agent_id in ("", ".", ".."):
            raise ValueError(f"agent id {agent_id!r} cannot name a folder")
        return self.root / agent_id / f"{session_id}.jsonl"

    def append(self, agent_id: str, session_id: str, record: dict[str, Any]) -> None:
        """One line, durable (fsync) before this returns."""
        path = self.path(agent_id, session_id)
        created = not path.parent.is_dir()
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = json.dumps(record, ensure_ascii=False, sort_keys=True).encode() + b"\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(path.parent.parent)
        fsync_dir(path.parent)


def read_trajectory(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """(attempt records in order, the session's outcome or None when it never ended). A torn last line (a crash
    mid-write) is left out; any other line that is not a JSON object raises ValueError naming file and line."""
    attempts: list[dict[str, Any]] = []
    outcome: str | None = None
    lines = path.read_bytes().split(b"\n")
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            if number == len(lines):  # the last line without its newline: torn
                break
            raise ValueError(f"{path}:{number}: not a JSON line") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: not a JSON object")
        if record.get("kind") == "end":
            outcome = record.get("outcome") if isinstance(record.get("outcome"), str) else None
        elif record.get("kind") == "attempt":
            attempts.append(record)
        else:
            raise ValueError(f"{path}:{number}: unknown record kind {record.get('kind')!r}")
    return attempts, outcome


def exported_attempts(root: Path, agent_id: str | None) -> list[dict[str, Any]]:
    """Every attempt under ``root`` (one agent's, or all), oldest session first, each with its session's
    ``outcome`` (``success``, ``exhausted``, or null for a run that never ended); raises ValueError on a bad file."""
    if not root.is_dir():
        return []
    folders = [root / agent_id] if agent_id else sorted(p for p in root.iterdir() if p.is_dir())
    sessions: list[tuple[str, str, list[dict[str, Any]], str | None]] = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in folder.glob("*.jsonl"):
            attempts, outcome = read_trajectory(path)
            if attempts:
                sessions.append((str(attempts[0].get("ts", "")), path.stem, attempts, outcome))
    out = []
    for _, _, attempts, outcome in sorted(sessions, key=lambda s: (s[0], s[1])):
        for record in attempts:
            line = {k: v for k, v in record.items() if k != "kind"}
            line["outcome"] = outcome
            out.append(line)
    return out
