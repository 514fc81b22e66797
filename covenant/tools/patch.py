"""Unified diffs: parse one into per-file hunks and apply them to text, nothing else (pure).

Accepted: ``diff -u`` and ``git diff`` output (``a/``/``b/`` prefixes are
stripped, ``diff --git``/``index``/mode lines skipped), ``/dev/null`` for a
created or deleted file, ``\\ No newline at end of file``. A hunk must match
exactly (no fuzz); it may have moved by some lines from the position its
header states, after the previous hunk of the same file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["PatchError", "Hunk", "FilePatch", "parse_patch", "apply_hunks"]

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_DEV_NULL = "/dev/null"


class PatchError(Exception):
    """The patch does not parse, or a hunk does not apply; the message says where."""


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[tuple[str, str]] = field(default_factory=list)
    """(``" "``, ``"-"`` or ``"+"``, the line with its newline unless the diff said it has none)."""

    def old(self) -> list[str]:
        return [text for op, text in self.lines if op != "+"]

    def new(self) -> list[str]:
        return [text for op, text in self.lines if op != "-"]


@dataclass
class FilePatch:
    old: str | None
    """The path before (None: the file is created)."""
    new: str | None
    """The path after (None: the file is deleted)."""
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new if self.new is not None else self.old  # type: ignore[return-value]


def _header_path(line: str, prefix: str) -> str | None:
    raw = line[len(prefix):].rstrip("\r\n").split("\t", 1)[0]
    if raw == _DEV_NULL:
        return None
    if raw.startswith('"') and raw.endswith('"'):
        raise PatchError(f"quoted file names are not supported: {raw}")
    if raw.startswith(("a/", "b/")):
        raw = raw[2:]
    if not raw:
        raise PatchError(f"no file name in {line.rstrip()!r}")
    return raw


def parse_patch(text: str) -> list[FilePatch]:
    """The files a unified diff changes, in order; raise PatchError naming the line that is wrong."""
    lines = text.splitlines(keepends=True)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"line {i + 1}: '---' header not followed by a '+++' header")
        current = FilePatch(old=_header_path(line, "--- "), new=_header_path(lines[i + 1], "+++ "))
        if current.old is None and current.new is None:
            raise PatchError(f"line {i + 1}: both sides are /dev/null")
        files.append(current)
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            i = _parse_hunk(lines, i, current)
        if not current.hunks:
            raise PatchError(f"line {i + 1}: file {current.path} has no hunk")
    if not files:
        raise PatchError("no '--- '/'+++ ' file header found: not a unified diff")
    return files


def _parse_hunk(lines: list[str], i: int, into: FilePatch) -> int:
    match = _HUNK.match(lines[i])
    if match is None:
        raise PatchError(f"line {i + 1}: malformed hunk header {lines[i].rstrip()!r}")
    old_start, new_start = int(match[1]), int(match[3])
    old_len = int(match[2]) if match[2] is not None else 1
    new_len = int(match[4]) if match[4] is not None else 1
    hunk = Hunk(old_start, old_len, new_start, new_len)
    seen_old = seen_new = 0
    i += 1
    while (seen_old < old_len or seen_new < new_len) and i < len(lines):
        line = lines[i]
        op, body = line[:1], line[1:]
        if line in ("\n", "\r\n"):  # an empty context line whose leading space was stripped
            op, body = " ", line
        if op not in (" ", "-", "+"):
            raise PatchError(f"line {i + 1}: expected a hunk line (' ', '-' or '+'), got {line.rstrip()!r}")
        if not body.endswith("\n"):
            body += "\n"
        hunk.lines.append((op, body))
        seen_old += op != "+"
        seen_new += op != "-"
        i += 1
        if i < len(lines) and lines[i].startswith("\\"):
            hunk.lines[-1] = (op, body[:-1])
            i += 1
    if seen_old != old_len or seen_new != new_len:
        raise PatchError(f"line {i}: hunk @@ -{old_start},{old_len} +{new_start},{new_len} @@ is cut short")
    into.hunks.append(hunk)
    return i


def _find(lines: list[str], want: list[str], guess: int, start: int) -> int | None:
    """The index nearest ``guess`` (not before ``start``) where ``want`` matches ``lines``."""
    last = len(lines) - len(want)
    if last < start:
        return None
    guess = min(max(guess, start), last)
    for distance in range(0, max(guess - start, last - guess) + 1):
        for at in (guess - distance, guess + distance) if distance else (guess,):
            if start <= at <= last and lines[at:at + len(want)] == want:
                return at
    return None


def apply_hunks(original: str, file: FilePatch) -> str:
    """``original`` with ``file``'s hunks applied in order; raise PatchError naming the hunk that does not match."""
    lines = original.splitlines(keepends=True)
    out: list[str] = []
    done = 0
    for number, hunk in enumerate(file.hunks, 1):
        old = hunk.old()
        guess = hunk.old_start if hunk.old_len == 0 else hunk.old_start - 1
        at = _find(lines, old, guess, done)
        if at is None:
            raise PatchError(
                f"{file.path}: hunk {number} (@@ -{hunk.old_start},{hunk.old_len} @@) does not match the file's "
                "current content; read the file again and make a new patch"
            )
        out.extend(lines[done:at])
        out.extend(hunk.new())
        done = at + len(old)
    out.extend(lines[done:])
    return "".join(out)
