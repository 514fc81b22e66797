"""Text from agents and models, made safe to put in front of a terminal.

One definition of what a terminal acts on instead of showing, used by the CLI's output
(:mod:`covenant.cli._output`) and the daemon's log (:mod:`covenant.logs`). Kept free of imports
beyond ``re``: ``covenant dispatch`` loads it on its fast path.
"""

from __future__ import annotations

import re

__all__ = ["ACTIVE", "neutralize", "json_escaped"]

ACTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and newline (ESC, BEL, CR, ...), DEL, C1 controls (a one-byte CSI among them), the
line and paragraph separators (a line reader splits there) and the bidirectional embeddings, overrides and
isolates."""


def neutralize(text: str) -> str:
    """``text`` with every :data:`ACTIVE` character shown as its escape (``\\x1b``, ``\\u202e``).

    Raw, an agent's or a model's text could clear the screen and draw a fake result, set the clipboard
    (OSC 52) or the window title, or, with a carriage return or a right-to-left override, make a line
    read other than it is.
    """
    if not ACTIVE.search(text):
        return text
    return ACTIVE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text)


def json_escaped(document: str) -> str:
    """A JSON ``document`` (text) with what ``json.dumps(ensure_ascii=False)`` leaves raw of :data:`ACTIVE`
    written as JSON escapes (``\\u009b``): still the same, valid document. Those characters can only stand
    inside its strings; ``json.dumps`` escapes C0 itself."""
    return ACTIVE.sub(lambda m: f"\\u{ord(m.group()):04x}", document)
