"""Per-agent memory for ``rune@memory-*``: a hash-linked JSON lines file the daemon alone writes.

``<home>/state/memory/<agent id>/memory.jsonl`` (dirs 0700, file 0600),
one ``{"key", "value", "at"}`` record per store after a header
``{"format": "covenant-memory/v1", "agent": <id>}``; the latest record of a
key wins. The file is verified before it is loaded (:mod:`covenant.chainlog`):
a torn tail is cut and reported (log and a ``memory.recover`` audit event),
a changed record makes every memory call of that agent fail with
``memory_corrupt`` until an operator repairs or removes the file. A file
changed behind the daemon's back (its inode, size or mtime moved) is
verified again before the next call. When superseded records outnumber the
live ones (and there are more than 64) the file is rewritten, compacted,
atomically.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from covenant.audit.events import MEMORY_RECOVER
from covenant.chainlog import Chain, TornTail
from covenant.clock import now_ms
from covenant.home import Home
from covenant.tools.chain_file import VerifiedChainFile, open_verified
from covenant.tools.result import ToolError

__all__ = [
    "MemoryStores",
    "check_key",
    "record_problem",
    "AgentMemory",
    "MEMORY_FORMAT",
    "MEMORY_RECOVER",
    "KEY_MAX_BYTES",
    "VALUE_MAX_BYTES",
    "MAX_KEYS",
    "memory_dir",
]


MEMORY_FORMAT = "covenant-memory/v1"
KEY_MAX_BYTES = 128
VALUE_MAX_BYTES = 16 * 1024
MAX_KEYS = 1000
_COMPACT_MIN = 64

_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def memory_dir(home: Home, agent_id: str) -> Path:
    """``<home>/state/memory/<agent id>``; refuses an id that could name another path."""
    if not _AGENT_ID.match(agent_id) or ".." in agent_id:
        raise ValueError(f"agent id {agent_id!r} cannot name a memory folder")
    return home.state_dir / "memory" / agent_id


def _key_problem(key: str) -> str | None:
    size = len(key.encode("utf-8", "surrogatepass"))
    if not key or size > KEY_MAX_BYTES:
        return f"key must be 1 to {KEY_MAX_BYTES} bytes of UTF-8, got {size}"
    if _CONTROL.search(key):
        return "key must not hold control characters"
    return None


def check_key(key: str) -> None:
    """Raise ``invalid_arguments`` for a key that is empty, too long or holds control characters."""
    problem = _key_problem(key)
    if problem is not None:
        raise ToolError("invalid_arguments", problem)


def record_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with a stored record's shape (``{"key", "value", "at"}``), or None."""
    if set(record) != {"key", "value", "at"}:
        return f"a memory record has exactly key, value and at; this one has {', '.join(sorted(record))}"
    key, value, at = record["key"], record["value"], record["at"]
    if not isinstance(key, str) or not isinstance(value, str) or type(at) is not int:
        return "a memory record's key and value are strings and at is an integer"
    if len(value.encode("utf-8", "surrogatepass")) > VALUE_MAX_BYTES:
        return f"a memory record's value is over {VALUE_MAX_BYTES} bytes"
    return _key_problem(key)


class AgentMemory(VerifiedChainFile):
    """One agent's memory: its verified file, the latest value of each key, a lock."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.latest: dict[str, dict[str, Any]] = {}
        super().__init__(path, header, record_problem)

    def _adopt(self, chain: Chain | None) -> None:
        super()._adopt(chain)
        self.latest = {}
        for record in self.records:
            self.latest.pop(record["key"], None)  # re-insert: dict order is most recent last
            self.latest[record["key"]] = record

    def store(self, key: str, value: str) -> dict[str, Any]:
        """Append one record (durable when this returns); compact when superseded records dominate (blocking)."""
        if key not in self.latest and len(self.latest) >= MAX_KEYS:
            raise ToolError("memory_full", f"this agent's memory holds {MAX_KEYS} keys, the most allowed; reuse a key")
        self.append({"key": key, "value": value, "at": now_ms()})
        superseded = len(self.records) - len(self.latest)
        if superseded > max(len(self.latest), _COMPACT_MIN):
            self.rewrite(list(self.latest.values()))
        return self.latest[key]


class MemoryStores:
    """Every agent's memory, loaded on first use; blocking work in worker threads."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self._agents: dict[str, AgentMemory] = {}

    def _memory(self, agent_id: str) -> AgentMemory:
        memory = self._agents.get(agent_id)
        if memory is None:
            header = {"format": MEMORY_FORMAT, "agent": agent_id}
            memory = AgentMemory(memory_dir(self.home, agent_id) / "memory.jsonl", header)
            self._agents[agent_id] = memory
        return memory

    async def open(self, agent_id: str, report: Callable[[Path, TornTail], Awaitable[None]]) -> AgentMemory:
        """The agent's verified memory; its lock must be held by the caller.

        ``report(torn)`` is awaited when a torn tail was cut. A changed record
        raises ``memory_corrupt``.
        """
        memory = self._memory(agent_id)
        torn = await open_verified(memory, agent_id, "memory", "memory_corrupt")
        if torn is not None:
            await report(memory.path, torn)
        return memory

    def lock(self, agent_id: str) -> trio.Lock:
        return self._memory(agent_id).lock

    def forget(self, agent_id: str) -> None:
        """An agent gone for good (a spawned one that ended): its memory, loaded and on disk (blocking)."""
        self._agents.pop(agent_id, None)
        shutil.rmtree(memory_dir(self.home, agent_id), ignore_errors=True)
