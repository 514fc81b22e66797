"""One verified hash-linked JSON lines file the daemon alone writes (:mod:`covenant.chainlog`).

The shared core of per-agent memory (:mod:`covenant.tools.memory_store`) and
the knowledge, task and event stores (:mod:`covenant.tools.agent_stores`):
the file is verified in full before its records are used, read again when it
changed behind the daemon's back (its inode, size or mtime moved), and its
folders are made 0700 on first use (agent uids may not list them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from covenant.chainlog import Chain, ChainCorrupt, TornTail, append_records, read_chain, rewrite_chain
from covenant.tools.result import ToolError

__all__ = ["VerifiedChainFile", "open_verified"]

log = logging.getLogger("covenant.tools")


@dataclass
class VerifiedChainFile:
    """A chain file with its header and record shape rule; its verified records once loaded."""

    path: Path
    header: dict[str, Any]
    check: Callable[[dict[str, Any]], str | None]
    """What is wrong with a stored record, or None."""
    lock: trio.Lock = field(default_factory=trio.Lock)
    chain: Chain | None = None
    loaded: bool = False

    @property
    def records(self) -> list[dict[str, Any]]:
        """The verified records, header excluded."""
        return self.chain.records[1:] if self.chain else []

    def _changed_on_disk(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self.chain is not None
        return self.chain is None or (st.st_ino, st.st_size, st.st_mtime_ns) != self.chain.stamp

    def _adopt(self, chain: Chain | None) -> None:
        """Take ``chain`` as the file's verified content; subclasses index it."""
        self.chain = chain
        self.loaded = True

    def load(self) -> TornTail | None:
        """(Re)load and verify when needed (blocking). Raises ChainCorrupt."""
        if self.loaded and not self._changed_on_disk():
            return None
        self.loaded = False
        folder = self.path.parent
        if not folder.is_dir():
            folder.parent.parent.mkdir(parents=True, exist_ok=True)  # state/, normally made by init
            folder.parent.mkdir(exist_ok=True, mode=0o700)
            folder.mkdir(exist_ok=True, mode=0o700)
        chain = read_chain(self.path, self.header, self.check)
        self._adopt(chain)
        return chain.torn if chain else None

    def append(self, record: dict[str, Any]) -> None:
        """Append one record, durable when this returns (blocking)."""
        problem = self.check(record)
        assert problem is None, problem  # the daemon built it; a wrong shape is a bug, never written
        try:
            chain = append_records(self.path, self.chain, self.header, [record])
        except BaseException:
            self.loaded = False  # the file may hold a torn tail now: read it again next time
            raise
        self._adopt(chain)

    def rewrite(self, records: list[dict[str, Any]]) -> None:
        """Replace the records (compaction), atomically (blocking)."""
        self._adopt(rewrite_chain(self.path, self.header, records))


async def open_verified(file: VerifiedChainFile, agent_id: str, what: str, error_code: str) -> TornTail | None:
    """Load and verify ``file`` in a worker thread (hold its lock); the torn tail it cut, if any.

    A changed record raises ``error_code`` naming ``what`` ("memory", "tasks store"); a cut tail is
    logged here and returned for the caller to audit.
    """
    try:
        torn = await trio.to_thread.run_sync(file.load)
    except ChainCorrupt as exc:
        log.error("chain file fails verification",
                  extra={"agent": agent_id, "store": what, "path": str(exc.path), "detail": str(exc)})
        raise ToolError(
            error_code,
            f"this agent's {what} failed verification at line {exc.line} ({exc.reason}) and is not loaded; "
            "an operator must repair or remove the file",
        ) from None
    if torn is not None:
        log.warning("chain file had a torn tail; cut",
                    extra={"agent": agent_id, "store": what, "path": str(file.path), "discarded_bytes": torn.discarded_bytes})
    return torn
