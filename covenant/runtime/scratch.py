"""Per-dispatch scratch dirs, made ahead and removed behind the dispatch.

Every dispatch gets a fresh, empty, 0700 dir (its HOME and TMPDIR). On ext4
``mkdir`` + ``rmdir`` cost ~0.13 ms together when the disk is idle and
several ms when another process is syncing the journal; done inline they
block the event loop for every other dispatch. So a background task keeps a
few fresh dirs ready and removes the empty dirs dispatches leave behind, in
one worker-thread hop per batch of four (or after a second). A dir an agent left files in is measured
and removed by the dispatch itself before its record is made (its size is
part of the record); an empty one is measured with one ``listdir`` and
removed right after. :meth:`ScratchDirs.close` removes everything left.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import trio

__all__ = ["ScratchDirs", "measure_and_remove", "remove_owned_entries"]

_SPARE = 8
"""Fresh dirs kept ready: enough for a burst of concurrent dispatches."""
_LINGER_S = 1.0
"""Longest an empty given-back dir waits for its batch (batches form at spare/2)."""


def measure_and_remove(path: str) -> int:
    """Total apparent size of the files under ``path``, then delete it (blocking)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    shutil.rmtree(path, ignore_errors=True)
    return total


def remove_owned_entries(dirs: tuple[str, ...], uid: int) -> int:
    """Remove every entry directly in ``dirs`` that ``uid`` owns; return their total size (blocking).

    For shared world-writable dirs (``/tmp``, ``/dev/shm``) after an agent
    uid's last run: what it left there is measured and removed.
    """
    total = 0
    for parent in dirs:
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid != uid:
                continue
            if entry.is_dir(follow_symlinks=False):
                total += measure_and_remove(entry.path)
            else:
                total += st.st_size
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
    return total


class ScratchDirs:
    """Fresh scratch dirs under ``root``; :meth:`run` is the background keeper."""

    def __init__(self, root: Path, spare: int = _SPARE) -> None:
        self.root = root
        self.spare = spare
        self._ready: list[str] = []
        self._doomed: list[str] = []
        self._work = trio.Event()

    def make(self) -> str:
        """A new dir made now (blocking; safe on any thread)."""
        return tempfile.mkdtemp(prefix="dispatch-", dir=self.root)

    def take(self) -> str | None:
        """A fresh empty dir made ahead, or None when none is ready (then :meth:`make` one)."""
        if len(self._ready) <= self.spare // 2:
            self._work.set()
        return self._ready.pop() if self._ready else None

    async def give_back(self, path: str) -> int:
        """Bytes the dispatch left in ``path``; the dir is gone or queued for removal."""
        try:
            empty = not os.listdir(path)
        except FileNotFoundError:
            return 0
        except OSError:
            empty = False
        if empty:
            self._doomed.append(path)
            if len(self._doomed) >= self.spare // 2:
                self._work.set()
            return 0
        return await trio.to_thread.run_sync(measure_and_remove, path)

    def _batch(self, doomed: list[str], make: int) -> list[str]:
        for path in doomed:
            try:
                os.rmdir(path)
            except OSError:
                measure_and_remove(path)  # something appeared after the check
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
        """Remove the ready dirs and those still queued (blocking; call once the runs are over)."""
        doomed, self._doomed = self._doomed + self._ready, []
        self._ready = []
        self._batch(doomed, 0)
