"""Where a key or table sits in a TOML text, for messages that name the line.

``tomllib`` reports no positions for valid documents, so a problem found by
validation (a manifest field, a covenant.toml key) is placed by scanning the
text for the table header and the ``key =`` line.
"""

from __future__ import annotations

import re

__all__ = ["key_line", "entry_key_line"]

_HEADER = re.compile(r"^\s*\[\[?\s*([^\[\]#]+?)\s*\]\]?\s*(?:#.*)?$")


def key_line(text: str, section: str | None, key: str | None) -> int | None:
    """1-based line of ``key =`` inside ``[section]``, else of the header, else of ``key =`` anywhere."""
    current: str | None = None
    section_line: int | None = None
    key_re = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=") if key else None
    anywhere: int | None = None
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            current = header.group(1).strip().strip("\"'")
            if current == section and section_line is None:
                section_line = number
            continue
        if key_re is not None and key_re.match(line):
            if current == section:
                return number
            if anywhere is None:
                anywhere = number
    return section_line if section_line is not None else anywhere


def entry_key_line(text: str, table: str, id_key: str, id_value: str, key: str) -> int | None:
    """1-based line of ``key =`` in the ``[[table]]`` entry whose ``id_key`` is ``id_value`` (a
    ``[[schedules]]`` by its name, a ``[[webhooks.routes]]`` by its path), else of that entry's header."""
    id_re = re.compile(rf"^\s*{re.escape(id_key)}\s*=\s*([\"'])(.*)\1\s*(?:#.*)?$")
    key_re = re.compile(rf"^\s*{re.escape(key)}\s*=")
    header: int | None = None
    found_key: int | None = None
    matched = False
    for number, line in enumerate([*text.splitlines(), "[]"], 1):
        title = _HEADER.match(line)
        if title or line == "[]":
            if header is not None and matched:
                return found_key or header
            inside = title is not None and line.strip().startswith("[[") and title.group(1).strip() == table
            header, found_key, matched = (number if inside else None), None, False
            continue
        if header is None:
            continue
        if (ident := id_re.match(line)) is not None and ident.group(2) == id_value:
            matched = True
        if key_re.match(line) and found_key is None:
            found_key = number
    return None
