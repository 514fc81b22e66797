"""files_under: the package and skill walk, without recursion, to a bounded depth."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from covenant.manifest.file_tree import TooDeep, files_under


def _nest(base: Path, depth: int) -> Path:
    """``depth`` folders under ``base``, one in the other; returns the innermost."""
    inner = base.joinpath(*["d"] * depth)
    inner.mkdir(parents=True)
    return inner


def test_every_file_folder_by_folder_in_name_order_with_dot_names_left_out_when_asked(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / ".hidden").write_text("h")
    (tmp_path / "b" / "c.txt").write_text("c")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("x")
    names = [p.relative_to(tmp_path).as_posix() for p in files_under(tmp_path, skip_dot_names=True)]
    assert names == ["a.txt", "b/c.txt"]
    every = sorted(p.relative_to(tmp_path).as_posix() for p in files_under(tmp_path, skip_dot_names=False))
    assert every == [".git/HEAD", ".hidden", "a.txt", "b/c.txt"]


def test_a_link_to_a_folder_is_never_entered_so_a_loop_ends(tmp_path: Path) -> None:
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "f").write_text("f")
    os.symlink(tmp_path, tmp_path / "inner" / "loop")
    os.symlink(tmp_path / "inner" / "f", tmp_path / "link-to-file")
    names = sorted(p.name for p in files_under(tmp_path, skip_dot_names=True))
    assert names == ["f", "link-to-file"]


@pytest.fixture
def deep_package(tmp_path: Path) -> Iterator[Path]:
    """A package folder with 1,200 folders one in the other and a file at the bottom; removed with `rm -rf`:
    shutil.rmtree (pytest's own clean-up too) recurses as deep as the tree."""
    deep = tmp_path / "pkg"
    inner = deep
    for _ in range(12):  # 12 x 100 levels: paths stay under PATH_MAX per makedirs
        inner = inner.joinpath(*["d"] * 100)
        os.makedirs(inner)
    (inner / "f").write_text("x")
    yield deep
    subprocess.run(["rm", "-rf", str(deep)], check=True)


def test_a_tree_deeper_than_the_limit_is_refused_not_a_recursion_error(deep_package: Path) -> None:
    """os.walk and Path.rglob raise RecursionError at ~1,000 levels in Python 3.11 (the daemon's scan died of it)."""
    with pytest.raises(TooDeep, match="deeper than 64 levels"):
        list(files_under(deep_package, skip_dot_names=True))
    assert [p.name for p in files_under(deep_package, skip_dot_names=True, max_depth=2000)] == ["f"]


def test_exactly_the_limit_is_allowed(tmp_path: Path) -> None:
    inner = _nest(tmp_path / "pkg", 3)
    (inner / "f").write_text("x")
    assert len(list(files_under(tmp_path / "pkg", skip_dot_names=True, max_depth=3))) == 1
    with pytest.raises(TooDeep):
        list(files_under(tmp_path / "pkg", skip_dot_names=True, max_depth=2))
