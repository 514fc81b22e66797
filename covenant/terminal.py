"""Text from agents and models, made safe to put in front of a terminal.

One definition of what a terminal acts on instead of showing, used by the CLI's output
(:mod:`covenant.cli._output`) and the daemon's log (:mod:`covenant.logs`). Kept free of imports, even
``re`` (with its ``enum``, ≈ 21 million instructions): ``covenant dispatch`` loads it on its fast path.
"""

from __future__ import annotations

__all__ = ["ACTIVE", "neutralize", "json_escaped"]

_ACTIVE_CODES = (*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F),
                 *range(0x2066, 0x206A))
ACTIVE = frozenset(map(chr, _ACTIVE_CODES))
"""C0 controls but tab and newline (ESC, BEL, CR, ...), DEL, C1 controls (a one-byte CSI among them), the
line and paragraph separators (a line reader splits there) and the bidirectional embeddings, overrides and
isolates."""

_SHOWN = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _ACTIVE_CODES}
_AS_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in _ACTIVE_CODES}


def neutralize(text: str) -> str:
    """``text`` with every :data:`ACTIVE` character shown as its escape (``\\x1b``, ``\\u202e``).

    Raw, an agent's or a model's text could clear the screen and draw a fake result, set the clipboard
    (OSC 52) or the window title, or, with a carriage return or a right-to-left override, make a line
    read other than it is.
    """
    if ACTIVE.isdisjoint(text):
        return text
    return text.translate(_SHOWN)


def json_escaped(document: str) -> str:
    """A JSON ``document`` (text) with what ``json.dumps(ensure_ascii=False)`` leaves raw of :data:`ACTIVE`
    written as JSON escapes (``\\u009b``): still the same, valid document. Those characters can only stand
    inside its strings; ``json.dumps`` escapes C0 itself."""
    if ACTIVE.isdisjoint(document):
        return document
    return document.translate(_AS_JSON_ESCAPES)
