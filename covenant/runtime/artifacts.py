"""Files an intent's tools hand back (rune@canvas-present's content): stored per intent, capped, daemon-owned.

Layout under ``$COVENANT_HOME/state/artifacts/``::

    <intent id>/index.json       [{name, media_type, bytes, sha256}, …] in the order they were made
    <intent id>/files/<name>     the bytes

Everything is 0700/0600 and the daemon's: agent uids never read or write it
(a tool's bytes reach the store through the daemon, never through a path the
agent chose). A file is written whole to a temporary name, fsynced and renamed
before the index names it, so a crash leaves at most an unnamed file, never an
index entry without its bytes. The caps (``[tools.artifacts]``) hold per
intent: the number of files and their total size; a save past them is refused
with :class:`ArtifactRefused` and nothing is written.

The index is what the dispatch record's ``artifacts`` field copies; reads go
through :meth:`ArtifactStore.read`, which checks the bytes against the index's
sha256 so a changed file is never handed out as the intent's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from covenant.durable import replace_file

__all__ = ["ArtifactStore", "ArtifactRefused", "ArtifactLimits", "MEDIA_TYPES", "NAME_PATTERN", "artifact_name_problem"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_NAME = re.compile(NAME_PATTERN)
_INTENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")

MEDIA_TYPES: dict[str, str] = {
    "image/png": ".png",
    "text/markdown": ".md",
    "text/html": ".html",
    "text/plain": ".txt",
    "application/json": ".json",
}
"""The media types an artifact may have, with the extension a name without one gets."""


class ArtifactRefused(Exception):
    """A save refused: a bad name or media type, or the intent's caps reached. The message says which."""


@dataclass(frozen=True)
class ArtifactLimits:
    max_files: int
    max_file_bytes: int
    max_intent_bytes: int


def artifact_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name an artifact, or None (1-100 of ``A-Za-z0-9._-``, first a letter or digit)."""
    if not isinstance(name, str) or not _NAME.match(name):
        return "an artifact name is 1-100 of A-Za-z0-9 . _ - starting with a letter or digit"
    return None


class ArtifactStore:
    """The artifacts of every intent under one directory; thread-safe (saves run in worker threads)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()

    def _intent_dir(self, intent_id: str) -> Path:
        if not _INTENT.match(intent_id):
            raise ArtifactRefused(f"intent id {intent_id[:80]!r} cannot key an artifact directory")
        return self.root / intent_id

    # -- writing ---------------------------------------------------------------------------------

    def save(self, intent_id: str, name: str, media_type: str, data: bytes, limits: ArtifactLimits) -> dict[str, Any]:
        """Store ``data`` as an artifact of the intent (blocking); returns its index entry.

        A name already taken by this intent gets ``-2``, ``-3``, … before its extension; a name
        without an extension gets the media type's.
        """
        if media_type not in MEDIA_TYPES:
            raise ArtifactRefused(f"media type {media_type[:80]!r} is not one of {', '.join(MEDIA_TYPES)}")
        problem = artifact_name_problem(name)
        if problem:
            raise ArtifactRefused(problem)
        if "." not in name.lstrip("."):
            name += MEDIA_TYPES[media_type]
        if len(data) > limits.max_file_bytes:
            raise ArtifactRefused(f"{len(data)} bytes is over [tools.artifacts] max_file_kb "
                                  f"({limits.max_file_bytes // 1024} KiB)")
        directory = self._intent_dir(intent_id)
        with self._lock:
            index = self._index(directory)
            if len(index) >= limits.max_files:
                raise ArtifactRefused(f"the intent has {len(index)} artifacts already ([tools.artifacts] max_files)")
            used = sum(entry["bytes"] for entry in index)
            if used + len(data) > limits.max_intent_bytes:
                raise ArtifactRefused(f"the intent's artifacts would be {used + len(data)} bytes, over [tools.artifacts] "
                                      f"max_intent_kb ({limits.max_intent_bytes // 1024} KiB)")
            name = _free_name(name, {entry["name"] for entry in index})
            entry = {"name": name, "media_type": media_type, "bytes": len(data),
                     "sha256": hashlib.sha256(data).hexdigest()}
            files = directory / "files"
            for made in (self.root, directory, files):  # each 0700: parents=True would make them umask's
                made.mkdir(mode=0o700, exist_ok=True)
            replace_file(files / name, data)
            replace_file(directory / "index.json", json.dumps([*index, entry], separators=(",", ":")).encode())
            return entry

    # -- reading ---------------------------------------------------------------------------------

    def may_have(self, intent_id: str) -> bool:
        """False when the intent certainly saved no artifact: its directory does not exist. One ``stat`` of
        a local directory, cheap enough for the event loop, so that the usual intent (no artifact) needs no
        worker thread to be listed."""
        return os.path.isdir(self._intent_dir(intent_id))

    def list(self, intent_id: str) -> list[dict[str, Any]]:
        """The intent's artifacts, oldest first; none when it made none (blocking)."""
        with self._lock:
            return self._index(self._intent_dir(intent_id))

    def read(self, intent_id: str, name: str) -> tuple[dict[str, Any], bytes] | None:
        """(index entry, bytes) of one artifact; None when the intent has none of that name.

        Raises :class:`ArtifactRefused` when the bytes on disk no longer match the index (a changed file).
        """
        if artifact_name_problem(name):
            return None
        directory = self._intent_dir(intent_id)
        entry = next((e for e in self.list(intent_id) if e["name"] == name), None)
        if entry is None:
            return None
        try:
            fd = os.open(directory / "files" / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ArtifactRefused(f"artifact {name} of intent {intent_id} is named in its index but missing") from None
        with os.fdopen(fd, "rb") as file:
            data = file.read()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ArtifactRefused(f"artifact {name} of intent {intent_id} does not match its sha256: it was changed")
        return entry, data

    def _index(self, directory: Path) -> list[dict[str, Any]]:
        try:
            text = (directory / "index.json").read_bytes()
        except FileNotFoundError:
            return []
        try:
            entries = json.loads(text)
        except ValueError:
            raise ArtifactRefused(f"{directory / 'index.json'} is not JSON") from None
        if not isinstance(entries, list) or not all(_entry_ok(e) for e in entries):
            raise ArtifactRefused(f"{directory / 'index.json'} is not a list of {{name, media_type, bytes, sha256}}")
        return entries


def _entry_ok(entry: Any) -> bool:
    return (isinstance(entry, dict) and set(entry) == {"name", "media_type", "bytes", "sha256"}
            and artifact_name_problem(entry["name"]) is None and entry["media_type"] in MEDIA_TYPES
            and type(entry["bytes"]) is int and entry["bytes"] >= 0
            and isinstance(entry["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]) is not None)


def _free_name(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    stem, dot, ext = name.rpartition(".")
    if not stem:
        stem, dot, ext = name, "", ""
    for n in range(2, 10_000):
        candidate = f"{stem[:90]}-{n}{dot}{ext}"
        if candidate not in taken:
            return candidate
    raise ArtifactRefused(f"no free name like {name}")
