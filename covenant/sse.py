"""Server-sent events (``event:``/``data:`` lines, blank line ends one): model providers' streams, replicas' answers.

Imported by the model gateway and by the Rune replica's wire (:mod:`covenant.rune.wire`), so it stays
free of daemon code.

A push parser fed the body's bytes as they arrive (no async generator: the gateway stops reading
at the provider's end marker, and an abandoned async generator would be finalized later by
trio's garbage-collection hook, with a warning and a wake-up per stream).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

__all__ = ["SseEvent", "SseParser"]


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str


class SseParser:
    """Feed it the stream's bytes; it returns each event once its blank line has arrived."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._partial = ""
        self._event = "message"
        self._data: list[str] = []

    def feed(self, data: bytes) -> list[SseEvent]:
        """Take the next bytes of the body (split anywhere, even inside a character)."""
        text = self._partial + self._decoder.decode(data)
        *lines, self._partial = text.split("\n")
        return [event for line in lines if (event := self._line(line.removesuffix("\r"))) is not None]

    def end(self) -> list[SseEvent]:
        """The body ended: a last line without its line end, and an event without its blank line."""
        tail, self._partial = self._partial + self._decoder.decode(b"", final=True), ""
        events = [self._line(tail.removesuffix("\r")) if tail else None, self._line("")]
        return [event for event in events if event is not None]

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            if not self._data:
                self._event = "message"
                return None
            event = SseEvent(self._event, "\n".join(self._data))
            self._event, self._data = "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None
