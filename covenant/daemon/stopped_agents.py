"""The agents an operator stopped with ``covenant stop``, kept in ``<home>/state/stopped-agents.json``.

A stop is an administrative switch, not a property of the manifest: it is keyed by agent id and outlives
reloads, restarts and the agent's file itself (an agent removed from the agents folder and added again
is still stopped until ``covenant start``). The file is replaced atomically and made durable (temp file,
fsync, rename, fsync of the folder) before a stop or start takes effect, so a daemon killed at any point
comes back with what it last answered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from covenant.errors import ConfigError
from covenant.policy._files import atomic_write_text

__all__ = ["StoppedAgents", "STOPPED_FILE"]

STOPPED_FILE = "stopped-agents.json"
"""Its name under the home's ``state/``."""


def _valid_entry(entry: Any) -> bool:
    return (isinstance(entry, dict) and type(entry.get("at_ms")) is int
            and (entry.get("by_uid") is None or type(entry.get("by_uid")) is int))


class StoppedAgents:
    """Agent id -> ``{"at_ms", "by_uid"}`` of its stop. :meth:`load` and :meth:`save` block: call them from a thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, agent_id: str) -> dict[str, Any] | None:
        return self.entries.get(agent_id)

    def load(self) -> None:
        """Read the file (none: nothing is stopped). A file that is not covenant's is a ConfigError naming it:
        guessing would start agents an operator stopped."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.entries = {}
            return
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.path}: unreadable list of stopped agents ({exc}); fix it, or move it aside "
                              "to start every agent", path=str(self.path)) from None
        entries = data.get("agents") if isinstance(data, dict) else None
        if not isinstance(entries, dict) or not all(isinstance(k, str) and _valid_entry(v) for k, v in entries.items()):
            raise ConfigError(f"{self.path}: not a covenant list of stopped agents (agents.ID.at_ms); fix it, or move "
                              "it aside to start every agent", path=str(self.path))
        self.entries = entries

    def with_stopped(self, agent_id: str, at_ms: int, by_uid: int | None) -> dict[str, dict[str, Any]]:
        """The entries with ``agent_id`` stopped (to :meth:`save`, then :meth:`adopt`)."""
        return {**self.entries, agent_id: {"at_ms": at_ms, "by_uid": by_uid}}

    def without(self, agent_id: str) -> dict[str, dict[str, Any]]:
        """The entries with ``agent_id`` started again."""
        return {k: v for k, v in self.entries.items() if k != agent_id}

    def save(self, entries: dict[str, dict[str, Any]]) -> None:
        """Write ``entries`` durably; the in-memory set is unchanged until :meth:`adopt`."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        text = json.dumps({"version": 1, "agents": entries}, indent=1, sort_keys=True) + "\n"
        atomic_write_text(self.path, text, mode=0o600)

    def adopt(self, entries: dict[str, dict[str, Any]]) -> None:
        """Make ``entries`` (saved) the set dispatches are checked against."""
        self.entries = entries
