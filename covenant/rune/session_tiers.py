"""A session's tier before it is loaded: ``clean``, ``suspicious`` (with the reasons) or ``tainted``.

The session bridge's integrity check, for covenant's session files. A
session is **tainted** when it fails verification (a changed byte, a record
out of place, a file that does not reach its signed head): that load is
refused as ``session_corrupt``, as before. A verified session is
**suspicious** when what earlier turns brought in looks like an attempt to
steer the model on a later load — the history is replayed to the model as
its own context, so text planted there acts again on every turn:

* an instruction-override phrase in a user turn or a tool result
  ("ignore all previous instructions", "you are now …", "reveal your system
  prompt", "exfiltrate" …);
* an encoded payload (a long base64 or hex run, a ``data:…;base64,`` URI);
* a tool result that addresses the model ("assistant: you must …",
  ``<|im_start|>``, ``[INST]``, a line starting ``system:``).

The model's own turns are not judged. The reasons name the turn, the role and
what matched (cut to :data:`QUOTE_MAX` characters); they are heuristics, meant to
make an operator look, not proof: ``[rune] suspicious`` decides whether such a
load goes ahead with a warning or is refused (``session_suspicious``).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Assessment", "QUOTE_MAX", "Tier", "assess", "tainted"]

Tier = Literal["clean", "suspicious", "tainted"]
QUOTE_MAX = 60
REASONS_MAX = 20
"""At most this many reasons are kept (a planted history could match on every line)."""

_OVERRIDE = re.compile(
    r"\b(?:ignore|disregard|forget|override)\b[^.\n]{0,40}?\b(?:previous|prior|above|earlier|all|your|the)\b"
    r"[^.\n]{0,20}?\b(?:instructions?|prompts?|rules|guidelines|directives)\b"
    r"|\byou are now\b(?:\s+(?:a|an|in|the|my|DAN)\b)"
    r"|\bnew (?:system )?instructions\s*:"
    r"|\b(?:reveal|print|show|repeat|leak)\b[^.\n]{0,20}\bsystem prompt\b"
    r"|\bexfiltrat\w*"
    r"|\b(?:developer|god|jailbreak) mode\b",
    re.IGNORECASE,
)
_ADDRESSES_MODEL = re.compile(
    r"(?:^|\n)\s*(?:system|assistant)\s*:"
    r"|<\|?(?:system|im_start|im_end)\|?>"
    r"|\[/?INST\]"
    r"|\b(?:dear |note to the |attention,? )?(?:assistant|AI|model|LLM|language model)\s*[,:]\s*"
    r"(?:you must|you should|please|now|ignore|do not|don't)\b"
    r"|\binstructions? (?:for|to) the (?:assistant|AI|model)\b",
    re.IGNORECASE,
)
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{120,}={0,2}")
_HEX_RUN = re.compile(r"\b[0-9a-fA-F]{128,}\b")
_DATA_URI = re.compile(r"data:[\w.+-]+/[\w.+-]+;base64,", re.IGNORECASE)


@dataclass(frozen=True)
class Assessment:
    tier: Tier
    reasons: list[str] = field(default_factory=list)


def tainted(why: str) -> Assessment:
    """The tier of a session that failed verification."""
    return Assessment("tainted", [why])


def _quote(text: str) -> str:
    shown = "".join(c if c.isprintable() else " " for c in text)[:QUOTE_MAX]
    return shown + ("…" if len(text) > QUOTE_MAX else "")


def _texts(message: dict[str, Any]) -> list[str]:
    """The text of a message: its content as a string, or the text parts of a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
    return []


def _decodes_to_text(run: str) -> bool:
    """A base64 run whose bytes are mostly printable text (a hidden instruction), not an image's or a hash's."""
    try:
        data = base64.b64decode(run + "=" * (-len(run) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in data[:4096])
    return bool(data) and printable / min(len(data), 4096) > 0.9


def _findings(text: str, role: str) -> list[str]:
    found = []
    if match := _OVERRIDE.search(text):
        found.append(f"instruction-override phrase {_quote(match.group(0))!r}")
    if role == "tool" and (match := _ADDRESSES_MODEL.search(text)):
        found.append(f"tool output addressing the model {_quote(match.group(0).strip())!r}")
    if match := _DATA_URI.search(text):
        found.append(f"encoded payload (data URI {_quote(match.group(0))!r})")
    elif any(_decodes_to_text(m.group(0)) for m in _BASE64_RUN.finditer(text)):
        found.append("encoded payload (a base64 run that decodes to text)")
    elif _HEX_RUN.search(text):
        found.append("encoded payload (a long hex run)")
    return found


def assess(turns: list[dict[str, Any]]) -> Assessment:
    """The tier of a verified session from its turn records (``{"kind": "turn", "messages": [...]}``)."""
    reasons: list[str] = []
    for number, turn in enumerate(turns, 1):
        for message in turn.get("messages") or ():
            if not isinstance(message, dict):
                continue
            role = str(message.get("role"))
            if role not in ("user", "tool"):
                continue
            for text in _texts(message):
                reasons.extend(f"turn {number} ({role}): {why}" for why in _findings(text, role))
    if not reasons:
        return Assessment("clean")
    return Assessment("suspicious", reasons[:REASONS_MAX])
