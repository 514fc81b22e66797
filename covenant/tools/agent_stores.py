"""Per-agent stores of ``rune@knowledge-*``, ``rune@task-*`` and ``rune@event-publish``, kept by the daemon.

Each is a hash-linked JSON lines file (:mod:`covenant.chainlog`) under
``<home>/state/<store>/<agent id>/<store>.jsonl`` (dirs 0700, file 0600,
the daemon's user): a header ``{"format": "covenant-<store>/v1", "agent":
<id>}`` then one record per change, each checked for its shape on load.
Verified in full before it is used, like memory (docs/tools.md): a torn
tail is cut and reported (log and a ``store.recover`` audit event); a
changed record makes every call of that store fail with ``store_corrupt``
until an operator repairs or removes the file; a file changed behind the
daemon's back is verified again before the next call.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from covenant.audit.events import STORE_RECOVER
from covenant.home import Home
from covenant.tools.chain_file import VerifiedChainFile, open_verified
from covenant.tools.memory_store import memory_dir

__all__ = ["AgentStore", "AgentStores", "StoreKind", "STORE_RECOVER"]


@dataclass(frozen=True)
class StoreKind:
    """One kind of store: its name (folder and file), the shape rule of its records."""

    name: str
    check: Callable[[dict[str, Any]], str | None]
    """What is wrong with a stored record, or None."""


class AgentStore(VerifiedChainFile):
    """One agent's store of one kind: its verified records (header excluded)."""

    def __init__(self, path: Path, header: dict[str, Any], kind: StoreKind) -> None:
        super().__init__(path, header, kind.check)
        self.kind = kind


class AgentStores:
    """Every agent's stores, loaded on first use; blocking work in worker threads."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self._stores: dict[tuple[str, str], AgentStore] = {}

    def _store(self, kind: StoreKind, agent_id: str) -> AgentStore:
        store = self._stores.get((kind.name, agent_id))
        if store is None:
            folder = self.home.state_dir / kind.name / memory_dir(self.home, agent_id).name
            header = {"format": f"covenant-{kind.name}/v1", "agent": agent_id}
            store = self._stores[(kind.name, agent_id)] = AgentStore(folder / f"{kind.name}.jsonl", header, kind)
        return store

    def lock(self, kind: StoreKind, agent_id: str) -> trio.Lock:
        return self._store(kind, agent_id).lock

    def forget(self, agent_id: str) -> None:
        """An agent gone for good (a spawned one that ended; spawned agents never outlive a run, so every store
        it used is loaded): its stores, loaded and on disk (blocking)."""
        for key in [key for key in self._stores if key[1] == agent_id]:
            shutil.rmtree(self._stores.pop(key).path.parent, ignore_errors=True)

    async def open(self, kind: StoreKind, agent_id: str, intent_id: str, audit: Any) -> AgentStore:
        """The agent's verified store (hold :meth:`lock`); ``store_corrupt`` when a record was changed."""
        store = self._store(kind, agent_id)
        torn = await open_verified(store, agent_id, f"{kind.name} store", "store_corrupt")
        if torn is not None:
            await audit(STORE_RECOVER, {
                "agent": agent_id, "intent": intent_id, "store": kind.name, "path": str(store.path),
                "valid_bytes": torn.valid_bytes, "discarded_bytes": torn.discarded_bytes,
                "discarded_sha256": torn.discarded_sha256,
            })
        return store
