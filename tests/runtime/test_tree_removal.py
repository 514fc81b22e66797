"""Removing agent-controlled trees: any depth with bounded descriptors and no recursion, never through a
link, never across a mount, and only what the owning uid could remove itself. Real trees on disk; the
ownership cases chown to agent-range uids (root only)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from covenant.runtime.tree_removal import DEPTH_BUDGET, Removal, empty_dir, remove_tree
from tests.conftest import REPO_ROOT

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
ALICE, BOB = 62111, 62112


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A dir on a tmpfs when there is one: what is measured here is the walk, not a disk's rmdir (2 ms each
    on a busy ext4). 0711, so the unprivileged case can reach it."""
    path = Path(tempfile.mkdtemp(prefix="covenant-trees-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    path.chmod(0o711)
    yield path
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def deep_tree(top: Path, levels: int, *, uid: int | None = None, file_every: int = 0) -> None:
    """``levels`` nested dirs under ``top`` (made relative to descriptors: the path outgrows PATH_MAX),
    a 3-byte file every ``file_every`` levels, all owned by ``uid`` when given."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for level in range(levels):
        os.mkdir("d", dir_fd=fd)
        if file_every and level % file_every == 0:
            file_fd = os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
            os.write(file_fd, b"abc")
            if uid is not None:
                os.fchown(file_fd, uid, uid)
            os.close(file_fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        if uid is not None:
            os.fchown(child, uid, uid)
        os.close(fd)
        fd = child
    os.close(fd)


def test_a_tree_deeper_than_the_recursion_limit_is_removed_with_its_bytes(tmp_path: Path) -> None:
    top = tmp_path / "home"
    top.mkdir()
    levels = sys.getrecursionlimit() + 200
    deep_tree(top, levels, file_every=100)
    removal = remove_tree(str(top))
    assert removal == Removal(bytes=3 * len(range(0, levels, 100)), complete=True, reason=None, left=0)
    assert not top.exists()


def test_links_are_removed_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    top = tmp_path / "home"
    (top / "a").mkdir(parents=True)
    (top / "a" / "to-dir").symlink_to(outside)
    (top / "a" / "to-file").symlink_to(outside / "keep")
    (top / "a" / "dangling").symlink_to(tmp_path / "nowhere")
    os.link(outside / "keep", top / "hard")
    assert remove_tree(str(top)).complete
    assert not top.exists()
    assert (outside / "keep").read_text() == "precious"
    link = tmp_path / "link-to-outside"
    link.symlink_to(outside)
    assert remove_tree(str(link)).complete  # the link itself, not what it points at
    assert not link.is_symlink() and (outside / "keep").exists()


def test_descriptors_stay_bounded_at_any_depth(tmp_path: Path) -> None:
    """1,500 levels removed by a process that may hold at most 64 descriptors."""
    top = tmp_path / "home"
    top.mkdir()
    deep_tree(top, 1_500)
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        sys.setrecursionlimit(200)
        from covenant.runtime.tree_removal import remove_tree
        removal = remove_tree({str(top)!r})
        assert removal.complete, removal
    """)
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)
    assert not top.exists()
    assert 2 * DEPTH_BUDGET + 8 < 64


@root_only
def test_only_the_owners_entries_are_removed_from_a_top_it_does_not_own(tmp_path: Path) -> None:
    """/tmp: another user's entries stay, the agent's go (its deep dirs too)."""
    top = tmp_path / "tmp"
    top.mkdir()
    os.chmod(top, 0o1777)
    (top / "bobs").mkdir()
    (top / "bobs" / "file").write_text("bob")
    os.chown(top / "bobs", BOB, BOB)
    (top / "bobs-file").write_text("bob")
    os.chown(top / "bobs-file", BOB, BOB)
    (top / "alices").mkdir()
    os.chown(top / "alices", ALICE, ALICE)
    deep_tree(top / "alices", 300, uid=ALICE, file_every=50)
    (top / "alices-file").write_bytes(b"12345")
    os.chown(top / "alices-file", ALICE, ALICE)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        removal = empty_dir(fd, ALICE)
    finally:
        os.close(fd)
    assert removal == Removal(bytes=5 + 6 * 3, complete=True, reason=None, left=0)
    assert sorted(os.listdir(top)) == ["bobs", "bobs-file"]
    assert (top / "bobs" / "file").read_text() == "bob"


@root_only
def test_another_uids_dir_inside_the_agents_tree_is_left_and_reported(tmp_path: Path) -> None:
    top = tmp_path / "home"
    (top / "a" / "foreign").mkdir(parents=True)
    (top / "a" / "foreign" / "theirs").write_text("x")
    (top / "a" / "empty-foreign").mkdir()
    for path in (top, top / "a"):
        os.chown(path, ALICE, ALICE)
    os.chown(top / "a" / "foreign", BOB, BOB)
    os.chown(top / "a" / "empty-foreign", BOB, BOB)
    removal = remove_tree(str(top))
    assert not removal.complete
    assert removal.reason is not None and "a/foreign" in removal.reason and f"uid {BOB}" in removal.reason
    assert (top / "a" / "foreign" / "theirs").read_text() == "x"  # never emptied by the agent's rights
    assert not (top / "a" / "empty-foreign").exists()  # an empty one its owner's parent may remove


@root_only
def test_an_unprivileged_owner_opens_up_what_it_locked_itself_out_of(tmp_path: Path) -> None:
    """The same removal run as the agent's uid itself (no root override): dirs it made 000 and 500 go."""
    top = tmp_path / "home"
    (top / "locked" / "inner").mkdir(parents=True)
    (top / "locked" / "inner" / "f").write_text("x")
    (top / "readonly").mkdir()
    (top / "readonly" / "g").write_text("y")
    for path in (top, top / "locked", top / "locked" / "inner", top / "locked" / "inner" / "f",
                 top / "readonly", top / "readonly" / "g"):
        os.chown(path, ALICE, ALICE)
    os.chmod(top / "locked", 0)
    os.chmod(top / "readonly", 0o500)
    code = f"from covenant.runtime.tree_removal import empty_dir\nimport os\n" \
           f"fd = os.open({str(top)!r}, os.O_RDONLY)\nr = empty_dir(fd, {ALICE})\nassert r.complete, r\n"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60, user=ALICE,
                   group=ALICE, extra_groups=[])
    assert os.listdir(top) == []
