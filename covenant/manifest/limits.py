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
  recursion too. YAML nesting is counted on the parser's event stream;
* **YAML aliases** — an alias is a reference, so a "billion laughs" document
  is small on disk and huge once anything walks it. The event stream is
  checked before anything is constructed: at most :data:`MAX_YAML_ALIASES`
  aliases, no alias inside its own anchor, and at most
  :data:`MAX_YAML_NODES` nodes counting every alias at its expanded size.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from covenant.config import RuntimeConfig

__all__ = [
    "ManifestLimits",
    "DEFAULT_LIMITS",
    "ManifestTooLarge",
    "MAX_DEPTH",
    "MAX_YAML_ALIASES",
    "MAX_YAML_NODES",
    "read_capped",
    "toml_depth_problem",
    "yaml_structure_problem",
]

MAX_DEPTH = 64
"""Deepest nesting of tables, arrays or mappings a manifest may have (real ones use 4)."""
MAX_YAML_ALIASES = 100
MAX_YAML_NODES = 100_000
"""Nodes of a YAML document with every alias counted at its expanded size."""


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


def _depth_message(line_hint: str = "") -> str:
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
                return text.count("\n", 0, match.start()) + 1, _depth_message(" (arrays or inline tables)")
        elif token in ("]", "}"):
            depth = max(depth - 1, 0)
    return None


def yaml_structure_problem(text: str) -> tuple[int, str] | None:
    """``(line, message)`` for a YAML text that nests too deep or whose aliases expand too far.

    Reads the parser's event stream only: nothing is composed or
    constructed, so an alias bomb costs its size on disk. A syntax error is
    left to the loader (which reports it with its line).
    """
    import yaml

    from covenant.manifest._yamlio import safe_loader

    sizes: dict[str, int] = {}  # anchor -> expanded node count
    stack: list[list[Any]] = []  # open collections: [anchor, expanded node count so far]
    total = 0
    aliases = 0
    try:
        for event in yaml.parse(text, Loader=safe_loader()):
            line = event.start_mark.line + 1
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                stack.append([event.anchor, 1])
                total += 1
                if len(stack) > MAX_DEPTH:
                    return line, _depth_message()
                continue
            if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                anchor, count = stack.pop()
                if anchor is not None:
                    sizes[anchor] = count
                if stack:
                    stack[-1][1] += count
                continue
            if isinstance(event, yaml.ScalarEvent):
                count = 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_YAML_ALIASES:
                    return line, (
                        f"parse error: more than {MAX_YAML_ALIASES} YAML aliases (*name); refused without expanding "
                        "them (write the values out)"
                    )
                if any(frame[0] == event.anchor for frame in stack):
                    return line, f"parse error: alias *{event.anchor} is inside its own anchor (a recursive structure); refused"
                count = sizes.get(event.anchor, 1)  # an undefined anchor is the loader's error to report
            else:
                continue
            total += count
            if stack:
                stack[-1][1] += count
            if total > MAX_YAML_NODES:
                return line, (
                    f"parse error: YAML aliases would expand this document past {MAX_YAML_NODES} nodes "
                    "(an alias bomb); refused without expanding it"
                )
    except yaml.YAMLError as exc:
        # libyaml >= 0.2.6 refuses deep flow nesting itself, while scanning ahead of the events counted here.
        if "maximum nesting depth" in str(getattr(exc, "problem", "")):
            mark = getattr(exc, "problem_mark", None)
            return (mark.line + 1 if mark is not None else 1), _depth_message()
        return None
    return None
