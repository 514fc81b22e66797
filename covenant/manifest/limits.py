"""Bounds on what an operator can drop into the agents folder.

A manifest is read by the daemon at start and on every reload, so a hostile
or broken file must cost one rejected manifest, never the daemon:

* **size** — a file larger than ``[runtime] max_manifest_bytes`` is refused
  from its ``fstat`` size, before a byte of it is read (and reading stops at
  the cap anyway, for files that grow or lie about their size);
* **nesting** — ``tomllib`` recurses once per nested array or inline table
  and raises RecursionError past ~300 levels; a TOML text is scanned for
  bracket depth before it is parsed, and the parsed document's depth (table
  headers and dotted keys nest without recursion) is measured without
  recursion too. YAML nesting and aliases are counted on the parser's event
  stream (:func:`covenant.manifest._yamlio.yaml_structure_problem`).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from covenant.config import RuntimeConfig

__all__ = [
    "ManifestLimits",
    "DEFAULT_LIMITS",
    "ManifestTooLarge",
    "MAX_DEPTH",
    "read_capped",
    "toml_depth_problem",
    "depth_message",
]

MAX_DEPTH = 64
"""Deepest nesting of tables, arrays or mappings a manifest may have (real ones use 4)."""


@dataclass(frozen=True)
class ManifestLimits:
    """``[runtime] max_manifest_bytes`` and ``allow_system_entries``, as the loaders need them."""

    max_bytes: int = 1024 * 1024
    allow_system_entries: bool = False

    @classmethod
    def from_config(cls, runtime: RuntimeConfig) -> ManifestLimits:
        return cls(runtime.max_manifest_bytes, runtime.allow_system_entries)


DEFAULT_LIMITS = ManifestLimits()


class ManifestTooLarge(Exception):
    """The file is over the cap; the message names the file, both sizes and the key to raise."""


def read_capped(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; ManifestTooLarge or OSError otherwise.

    Opened non-blocking so that a FIFO named like a manifest cannot hang the
    scan; its size is checked from ``fstat`` before reading.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        if st.st_size > max_bytes:
            raise ManifestTooLarge(_too_large(path, st.st_size, max_bytes))
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise ManifestTooLarge(_too_large(path, size, max_bytes, grew=True))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _too_large(path: Path, size: int, max_bytes: int, *, grew: bool = False) -> str:
    what = "grew past" if grew else f"is {size} bytes, over"
    return (
        f"io error: the file {what} the limit of {max_bytes} bytes for a manifest or package file; "
        f"nothing of it was loaded (raise [runtime] max_manifest_bytes in covenant.toml if it is really meant to be this big)"
    )


_TOML_TOKEN = re.compile(
    r'"""[\s\S]*?"""(?!")|\'\'\'[\s\S]*?\'\'\'(?!\')|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}]'
)


def depth_message(line_hint: str = "") -> str:
    return (
        f"parse error: nested deeper than {MAX_DEPTH} levels{line_hint}; a manifest this deep is refused "
        "(real manifests nest a few levels)"
    )


def toml_depth_problem(text: str) -> tuple[int, str] | None:
    """``(line, message)`` when arrays or inline tables nest deeper than :data:`MAX_DEPTH`; no parse needed.

    Strings and comments are skipped; brackets are counted. This bounds the
    recursion of ``tomllib``; table depth is checked after parsing
    (:func:`covenant.outside_json.nests_deeper`).
    """
    depth = 0
    for match in _TOML_TOKEN.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_DEPTH:
                return text.count("\n", 0, match.start()) + 1, depth_message(" (arrays or inline tables)")
        elif token in ("]", "}"):
            depth = max(depth - 1, 0)
    return None
