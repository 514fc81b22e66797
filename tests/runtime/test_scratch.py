"""Scratch dirs: an empty one goes back to its owner's next run; anything changed about it, and it is
removed instead. Real dirs, chowned to agent-range uids (root only)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from covenant.runtime.scratch import ScratchDirs
from covenant.runtime.tree_removal import Removal

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
ALICE, BOB = 62101, 62102


def given_back(dirs: ScratchDirs, uid: int) -> str:
    path = dirs.make()
    os.chown(path, uid, uid)
    assert trio.run(dirs.give_back, path) == Removal()
    return path


@root_only
def test_an_empty_dir_goes_back_to_its_owner_only(tmp_path: Path) -> None:
    dirs = ScratchDirs(tmp_path)
    alice = given_back(dirs, ALICE)
    assert dirs.take(BOB) is None  # nothing ready, and alice's dir is never bob's
    assert dirs.take(ALICE) == alice
    assert dirs.take(ALICE) is None  # handed out once


@pytest.mark.parametrize("change", ["file", "mode", "owner", "symlink", "gone"])
@root_only
def test_a_dir_changed_after_it_was_given_back_is_not_reused(tmp_path: Path, change: str) -> None:
    dirs = ScratchDirs(tmp_path)
    path = given_back(dirs, ALICE)
    if change == "file":  # planted by another process of the uid after the run ended
        Path(path, "planted").write_text("x")
    elif change == "mode":
        os.chmod(path, 0o755)
    elif change == "owner":
        os.chown(path, BOB, BOB)
    elif change == "symlink":
        os.rmdir(path)
        os.symlink(tmp_path, path)
    else:
        os.rmdir(path)
    assert dirs.take(ALICE) is None
    assert dirs.take(BOB) is None
    dirs.close()  # removes what was doomed (the link itself, never what it points at)
    assert not os.path.lexists(path)
    assert tmp_path.is_dir()


@root_only
def test_close_removes_the_dirs_kept_for_reuse(tmp_path: Path) -> None:
    dirs = ScratchDirs(tmp_path)
    kept = [given_back(dirs, uid) for uid in (ALICE, ALICE, BOB)]
    dirs.close()
    assert not any(os.path.exists(path) for path in kept)
    assert list(tmp_path.iterdir()) == []


@root_only
def test_reuse_is_bounded_per_uid(tmp_path: Path) -> None:
    dirs = ScratchDirs(tmp_path)
    made = [given_back(dirs, ALICE) for _ in range(6)]
    reused = [dirs.take(ALICE) for _ in range(6)]
    assert sorted(p for p in reused if p) == sorted(made[:4])  # four kept, the rest queued for removal
    dirs.close()
