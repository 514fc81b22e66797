"""``<home>/state/agent-schedules.json``: schedules that agents made with ``rune@schedule-create``.

Each is bound to the issuer of the intent that created it (its public key):
its firings are decided by that issuer's grants, and only intents of that
issuer list or delete it. The daemon's :class:`ScheduleRunner` picks changes
up within a second. Blocking I/O: call from a thread.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from covenant.policy._files import atomic_write_text
from covenant.triggers.config import ScheduleConfig

__all__ = ["AgentScheduleStore", "MAX_AGENT_SCHEDULES", "agent_schedules_path"]

MAX_AGENT_SCHEDULES = 256
"""Most agent-made schedules one home holds (all issuers together)."""

_LOCK = threading.Lock()

_DEFAULT_MAKER = "rune@schedule-create"


def agent_schedules_path(state_dir: Path) -> Path:
    return state_dir / "agent-schedules.json"


class AgentScheduleStore:
    """name -> {"schedule": ScheduleConfig fields, "issuer_pubkey", "created_by", "created_ms", "made_with"}.

    ``made_with`` is the tool that made it (``rune@schedule-create`` or ``rune@cron-create``; absent in
    entries written before it was kept, which schedule-create made).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def stamp(self) -> tuple[int, int] | None:
        """(mtime_ns, size) of the file, None when absent: what the runner polls for changes."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        entries = data.get("schedules") if isinstance(data, dict) else None
        return entries if isinstance(entries, dict) else {}

    def schedules(self) -> list[tuple[ScheduleConfig, str]]:
        """Each valid entry as (its config, its issuer's pubkey); a damaged entry is left out."""
        out = []
        for entry in self.read().values():
            try:
                out.append((ScheduleConfig.model_validate(entry["schedule"]), str(entry["issuer_pubkey"])))
            except (KeyError, TypeError, ValueError):
                continue
        return out

    def entries_of(self, issuer_pubkey: str, created_by: str) -> list[tuple[ScheduleConfig, str]]:
        """The valid entries ``created_by`` (an agent id) made for ``issuer_pubkey``, each with its ``made_with``."""
        out = []
        for entry in self.read().values():
            if entry.get("issuer_pubkey") != issuer_pubkey or entry.get("created_by") != created_by:
                continue
            try:
                out.append((ScheduleConfig.model_validate(entry["schedule"]), str(entry.get("made_with", _DEFAULT_MAKER))))
            except (KeyError, TypeError, ValueError):
                continue
        return out

    def add(self, schedule: ScheduleConfig, issuer_pubkey: str, created_by: str, now_ms: int,
            made_with: str = _DEFAULT_MAKER) -> str | None:
        """Store it; the reason it was refused (name taken, store full), or None."""
        with _LOCK:
            entries = self.read()
            if schedule.name in entries:
                return f"a schedule named {schedule.name!r} exists already"
            if len(entries) >= MAX_AGENT_SCHEDULES:
                return f"this home holds {MAX_AGENT_SCHEDULES} agent schedules, the most allowed"
            entries[schedule.name] = {"schedule": schedule.model_dump(mode="json"), "issuer_pubkey": issuer_pubkey,
                                      "created_by": created_by, "created_ms": now_ms, "made_with": made_with}
            self._write(entries)
            return None

    def delete(self, name: str, issuer_pubkey: str, created_by: str | None = None) -> bool:
        """Remove ``name`` when ``issuer_pubkey`` made it (and, given ``created_by``, that agent made it); False
        when there is no such schedule of theirs."""
        with _LOCK:
            entries = self.read()
            entry = entries.get(name)
            if entry is None or entry.get("issuer_pubkey") != issuer_pubkey:
                return False
            if created_by is not None and entry.get("created_by") != created_by:
                return False
            del entries[name]
            self._write(entries)
            return True

    def _write(self, entries: dict[str, Any]) -> None:
        atomic_write_text(self.path, json.dumps({"version": 1, "schedules": entries}, indent=1, sort_keys=True) + "\n")
