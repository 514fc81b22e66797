"""The files under a folder, walked without recursion and to a bounded depth.

``os.walk`` and ``Path.rglob`` recurse in Python 3.11, one frame per level: a package (or skill) folder
nested ~1,000 deep raised RecursionError out of the daemon's scan and took its start or reload down
with it. This walk keeps its own stack and refuses a tree deeper than ``max_depth`` with
:class:`TooDeep`, which callers report like any other package that cannot be read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["MAX_DEPTH", "TooDeep", "files_under"]

MAX_DEPTH = 64
"""Folders below the package's own, at most (a package with deeper ones gets no snapshot)."""


class TooDeep(Exception):
    """The tree nests folders deeper than it may."""


def files_under(base: Path, *, skip_dot_names: bool, max_depth: int = MAX_DEPTH) -> Iterator[Path]:
    """Every entry under ``base`` that is not a folder, folder by folder in name order.

    A symlink to a folder is neither entered nor given (a link to a file is given, as the link);
    a folder that cannot be listed is passed over, as ``os.walk`` does. Raises :class:`TooDeep`.
    """
    stack: list[tuple[str, int]] = [(str(base), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            continue
        below: list[str] = []
        for entry in entries:
            if skip_dot_names and entry.name.startswith("."):
                continue
            try:
                is_folder = entry.is_dir()
            except OSError:
                is_folder = False
            if not is_folder:
                yield Path(entry.path)
            elif not entry.is_symlink():
                if depth + 1 > max_depth:
                    raise TooDeep(f"folders nest deeper than {max_depth} levels under {base} ({entry.path})")
                below.append(entry.path)
        stack.extend((path, depth + 1) for path in reversed(below))
