"""Where a key or table sits in a TOML text, for messages that name the line.

``tomllib`` reports no positions for valid documents, so a problem found by
validation (a manifest field, a covenant.toml key) is placed by scanning the
text for the table header and the ``key =`` line.
"""

from __future__ import annotations

import re

__all__ = ["key_line"]

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
