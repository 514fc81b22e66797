"""Per-dispatch scratch dirs: empty, 0700, the agent uid's own; made ahead, reused or removed behind.

Every dispatch gets an empty, 0700 dir owned by the uid it runs as (its HOME
and TMPDIR). On ext4 ``mkdir`` + ``rmdir`` cost ~0.13 ms together when the
disk is idle and several ms when another process is syncing the journal
(and each is one more change the audit log's next sync commits). So:

- a dir a dispatch leaves empty (the usual case, checked with one ``listdir``)
  goes back to a pool of its owner's uid, and the next dispatch that runs as
  that uid gets it after ``lstat`` and ``listdir`` show it is still an empty
  0700 dir of that uid; anything else about it and it is removed instead;
- a dir an agent left files in is measured and removed by the dispatch itself
  before its record is made (its size is part of the record), with the agent
  uid's rights and at any depth (:mod:`covenant.runtime.tree_removal`): what
  cannot be removed is said in the record (``cleanup``) and the log;
- a background task keeps a few fresh dirs ready for uids with none to reuse,
  and removes the surplus, in one worker-thread hop per batch (or after a second).

:meth:`ScratchDirs.close` removes everything left.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import stat
import tempfile
from pathlib import Path

import trio

from covenant.runtime.tree_removal import Removal, remove_tree

__all__ = ["ScratchDirs"]

log = logging.getLogger("covenant.runtime")

_SPARE = 8
"""Fresh dirs kept ready: enough for a burst of concurrent dispatches."""
_LINGER_S = 1.0
"""Longest an empty given-back dir waits for its batch (batches form at spare/2)."""
_REUSE_PER_UID = 4
"""Empty dirs kept for reuse per uid (more concurrent runs of one uid get fresh ones)."""
_REUSE_TOTAL = 256
"""Empty dirs kept for reuse over all uids."""


class ScratchDirs:
    """Fresh scratch dirs under ``root``; :meth:`run` is the background keeper."""

    def __init__(self, root: Path, spare: int = _SPARE) -> None:
        self.root = root
        self.spare = spare
        self._ready: list[str] = []
        self._doomed: list[str] = []
        self._reusable: dict[int, list[str]] = {}
        """uid -> empty dirs that uid owns, given back by finished runs."""
        self._reusable_count = 0
        self._work = trio.Event()

    def make(self) -> str:
        """A new dir made now (blocking; safe on any thread)."""
        return tempfile.mkdtemp(prefix="dispatch-", dir=self.root)

    def take(self, uid: int) -> str | None:
        """An empty dir for a run as ``uid``: one it was given back, else a fresh one made ahead, else None
        (then :meth:`make` one). A fresh dir is covenant's: chown it to an agent uid before the spawn."""
        reused = self._reuse(uid)
        if reused is not None:
            return reused
        if len(self._ready) <= self.spare // 2:
            self._work.set()
        return self._ready.pop() if self._ready else None

    def _reuse(self, uid: int) -> str | None:
        pool = self._reusable.get(uid)
        while pool:
            path = pool.pop()
            self._reusable_count -= 1
            try:
                st = os.lstat(path)
                intact = stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == uid
                if intact and not os.listdir(path):
                    return path
            except FileNotFoundError:
                continue
            except OSError:
                pass
            self._doom(path)  # changed since it was given back: removed (and measured) the usual way
        return None

    async def give_back(self, path: str) -> Removal:
        """What the dispatch left in ``path`` (removed now, its bytes measured); an empty dir is kept for its
        owner's next run or removed behind."""
        try:
            empty = not os.listdir(path)
            owner = os.lstat(path).st_uid
        except FileNotFoundError:
            return Removal()
        except OSError:
            empty = False
        if empty:
            pool = self._reusable.setdefault(owner, [])
            if len(pool) < _REUSE_PER_UID and self._reusable_count < _REUSE_TOTAL:
                pool.append(path)
                self._reusable_count += 1
            else:
                self._doom(path)
            return Removal()
        removal = await trio.to_thread.run_sync(remove_tree, path)
        if not removal.complete:
            self._report(path, removal)
        return removal

    @staticmethod
    def _report(path: str, removal: Removal) -> None:
        log.warning("a scratch dir could not be removed whole",
                    extra={"path": path, "reason": removal.reason, "left": removal.left})

    def _doom(self, path: str) -> None:
        self._doomed.append(path)
        if len(self._doomed) >= self.spare // 2:
            self._work.set()

    def _batch(self, doomed: list[str], make: int) -> list[str]:
        for path in doomed:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except NotADirectoryError:  # no longer a dir: remove the entry, never what a link points at
                with contextlib.suppress(OSError):
                    os.unlink(path)
            except OSError:  # something appeared after the check
                removal = remove_tree(path)
                if not removal.complete:
                    self._report(path, removal)
        return [self.make() for _ in range(make)]

    async def run(self) -> None:
        """Keep ``spare`` dirs ready and remove given-back ones; runs until cancelled."""
        while True:
            with trio.move_on_after(_LINGER_S if self._doomed else math.inf):
                await self._work.wait()
            self._work = trio.Event()
            doomed, self._doomed = self._doomed, []
            make = max(0, self.spare - len(self._ready))
            if not (doomed or make):
                continue
            try:
                made = await trio.to_thread.run_sync(self._batch, doomed, make)
            except BaseException:
                self._doomed.extend(doomed)  # cancelled before the batch ran: close() removes them
                raise
            self._ready.extend(made)

    def close(self) -> None:
        """Remove the ready dirs, those kept for reuse and those still queued (blocking; call once the runs
        are over)."""
        doomed, self._doomed = self._doomed + self._ready, []
        for pool in self._reusable.values():
            doomed += pool
        self._ready, self._reusable, self._reusable_count = [], {}, 0
        self._batch(doomed, 0)
