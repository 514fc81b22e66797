"""``safety_policy``: secrets kept out of tool results and answers.

- ``none``: nothing is changed;
- ``standard``: the values of the provider keys the daemon holds, PEM private
  key blocks and well-known token shapes are replaced by ``[REDACTED]`` in
  tool results (before the model sees them) and in the final output;
- ``strict``: the same, tool results are also wrapped as untrusted data in the
  prompt (:mod:`covenant.rune.loop`), and an answer that still matches a
  secret pattern after redaction is refused (outcome ``unsafe_output``).

Redaction runs in the daemon, which alone knows the key values: in the
model gateway, on every answer before the replica sees it (so no replica,
session file or log can hold a key, whatever the model says: key values are
replaced even under ``none``), on tool results, and on the final output. A
streamed answer is redacted line by line (:class:`LineRedactor`): at most
the current line is held back, never the whole answer, because a token shape
or a PEM block split across deltas is only recognisable once its line is
whole. Under ``none`` only the exact key values are replaced, and those can be
caught without waiting for a line (:class:`ValueRedactor`): each delta goes
on as it arrives, less a tail that could be the start of a key value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["redact", "still_secret", "LineRedactor", "ValueRedactor", "REDACTED"]

REDACTED = "[REDACTED]"

_TOKEN_PATTERNS = re.compile(
    "|".join(
        (
            r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}",  # OpenAI / Anthropic keys
            r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
            r"github_pat_[A-Za-z0-9_]{30,}",
            r"AKIA[0-9A-Z]{16}",  # AWS access key ids
            r"xox[abprs]-[A-Za-z0-9-]{10,}",  # Slack tokens
            r"AIza[0-9A-Za-z_-]{35}",  # Google API keys
            r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}",  # JWTs
        )
    )
)
_PEM_BLOCK = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S)
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY-----")
_MIN_SECRET = 8


def _values(secrets: Iterable[str]) -> list[str]:
    # Longest first, so a key that contains another is replaced whole; short values would redact noise.
    return sorted({s for s in secrets if len(s) >= _MIN_SECRET}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str], *, patterns: bool = True) -> str:
    """``text`` with key values and (with ``patterns``) PEM private keys and token shapes replaced by ``[REDACTED]``."""
    for value in _values(secrets):
        text = text.replace(value, REDACTED)
    if not patterns:
        return text
    text = _PEM_BLOCK.sub(REDACTED, text)
    return _TOKEN_PATTERNS.sub(REDACTED, text)


def still_secret(text: str, secrets: Iterable[str]) -> bool:
    """Does ``text`` hold a key value or a secret shape?"""
    return any(v in text for v in _values(secrets)) or bool(_PEM_BEGIN.search(text) or _TOKEN_PATTERNS.search(text))


class LineRedactor:
    """Redacts a stream of text pieces, holding back only the current (unfinished) line.

    Inside a PEM private key block every line is withheld until its END line.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = _values(secrets)
        self._line = ""
        self._in_pem = False

    def feed(self, piece: str) -> str:
        """The finished lines of ``piece`` (with what was held), redacted."""
        self._line += piece
        if "\n" not in self._line:
            return ""
        *lines, self._line = self._line.split("\n")
        return "".join(self._one(line) + "\n" for line in lines if self._keep(line)) if lines else ""

    def flush(self) -> str:
        """The held-back rest, redacted (call once at the end)."""
        rest, self._line = self._line, ""
        if not rest or not self._keep(rest):
            return ""
        return self._one(rest)

    def _keep(self, line: str) -> bool:
        if self._in_pem:
            if _PEM_END.search(line):
                self._in_pem = False
            return False
        if _PEM_BEGIN.search(line) and not _PEM_END.search(line):
            self._in_pem = True
            return True  # the BEGIN line itself becomes [REDACTED]
        return True

    def _one(self, line: str) -> str:
        if _PEM_BEGIN.search(line):
            return REDACTED
        return redact(line, self._secrets)


class ValueRedactor:
    """Replaces key values in a stream of text pieces, holding back only what could begin one.

    For ``safety_policy: none``, where no secret shape is looked for: a key value is an exact string,
    so a piece can go on at once except for a tail that is the beginning of a key value (the rest of
    the key may come in the next piece). With no key values configured nothing is ever held.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = _values(secrets)
        self._pattern = re.compile("|".join(map(re.escape, self._secrets))) if self._secrets else None
        self._held = ""

    def feed(self, piece: str) -> str:
        """``piece`` (after what was held) with key values replaced, less a tail that may begin one."""
        text = self._held + piece
        cut = self._cut(text)
        self._held = text[cut:]
        return redact(text[:cut], self._secrets, patterns=False)

    def flush(self) -> str:
        """The held-back tail (call once at the end): no key value followed it."""
        rest, self._held = self._held, ""
        return redact(rest, self._secrets, patterns=False)

    def _cut(self, text: str) -> int:
        """Where the part that may be sent ends: the start of the earliest tail that a key value begins with.

        A tail never starts inside a whole key value found in ``text`` (that one is replaced whole), but a
        whole key value at the very end is held when a longer key value may continue it.
        """
        if self._pattern is None:
            return len(text)
        found = list(self._pattern.finditer(text))
        floor = 0
        if found:
            last = found[-1]
            floor = last.start() if self._begins_longer(text[last.start():]) else last.end()
        longest = len(self._secrets[0])
        for start in range(max(floor, len(text) - longest + 1), len(text)):
            if self._begins_longer(text[start:]):
                return start
        return len(text)

    def _begins_longer(self, tail: str) -> bool:
        return any(len(value) > len(tail) and value.startswith(tail) for value in self._secrets)
