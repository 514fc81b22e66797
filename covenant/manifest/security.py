"""Fail-closed file checks: covenant will not run code that someone else can edit.

A manifest, an entry, a Rune package file or the folder holding them that is
writable by group or others, or owned by a user other than root or the
daemon's own user, is a problem and its agent is rejected. Symlinks that
resolve outside the agents folder are rejected the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

from covenant.manifest.problems import Problem

__all__ = ["ownership_problems", "escape_problem", "is_inside"]


def ownership_problems(path: Path, what: str) -> list[Problem]:
    """Problems with who may write ``path`` (followed through symlinks); none when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return []  # the loader reports a missing or unreadable file with a better message
    problems: list[Problem] = []
    if st.st_mode & 0o022:
        problems.append(
            Problem(
                path,
                None,
                None,
                f"{what} is writable by group or others (mode {st.st_mode & 0o777:04o}); "
                f"refusing an agent anyone can edit: run `chmod go-w {path}`",
            )
        )
    if st.st_uid not in (0, os.geteuid()):
        problems.append(
            Problem(
                path,
                None,
                None,
                f"{what} is owned by uid {st.st_uid}, not root or covenant's user (uid {os.geteuid()}); "
                f"refusing it: `chown` it to one of those",
            )
        )
    return problems


def is_inside(real_path: str, real_root: str) -> bool:
    return real_path == real_root or real_path.startswith(real_root.rstrip(os.sep) + os.sep)


def escape_problem(path: Path, real_root: str, report_as: Path | None = None) -> Problem | None:
    """A problem (filed under ``report_as``, default ``path``) when ``path`` resolves outside ``real_root``."""
    real = os.path.realpath(path)
    if is_inside(real, real_root):
        return None
    return Problem(
        report_as or path,
        None,
        None,
        f"{path} resolves to {real}, outside the agents folder {real_root}; "
        "symlinks may not leave it: copy the agent in instead",
    )
