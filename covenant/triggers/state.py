"""``<home>/state/schedules.json``: the last slot each schedule fired (or skipped), written atomically.

The slot is written BEFORE its firing is audited and dispatched, so a daemon
killed at any point never fires that slot again after a restart (at most
once; a crash between the write and the dispatch loses that one firing, and
the ``schedule.fire`` record is then missing for it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from covenant.errors import ConfigError
from covenant.policy._files import atomic_write_text

__all__ = ["ScheduleState"]


class ScheduleState:
    """name -> {"last_slot_ms", "last_intent", "outcome"}; blocking I/O, call from a thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}

    def load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.path}: unreadable schedule state ({exc}); move it aside to start afresh "
                              "(every schedule then counts from this start)", path=str(self.path)) from None
        entries = data.get("schedules") if isinstance(data, dict) else None
        if not isinstance(entries, dict) or not all(
            isinstance(v, dict) and type(v.get("last_slot_ms")) is int for v in entries.values()
        ):
            raise ConfigError(f"{self.path}: not a covenant schedule state file (schedules.NAME.last_slot_ms); "
                              "move it aside to start afresh", path=str(self.path))
        self.entries = entries

    def last_slot(self, name: str) -> int | None:
        entry = self.entries.get(name)
        return entry["last_slot_ms"] if entry else None

    def save(self, name: str, **entry: Any) -> None:
        self.entries[name] = entry
        atomic_write_text(self.path, json.dumps({"version": 1, "schedules": self.entries}, indent=1, sort_keys=True) + "\n")
