"""Server-sent events, as both providers frame their streams (``event:``/``data:`` lines, blank line ends one).

A line parser rather than an async generator: the gateway stops reading at the provider's end
marker, and an abandoned async generator would be finalized later by trio's garbage-collection
hook (a warning and a wake-up per stream).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SseEvent", "SseParser"]


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str


class SseParser:
    """Feed it a stream's lines (without their line ends); it returns each event as it completes."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> SseEvent | None:
        """Take one line; a blank line ends an event and returns it. Comments, ``id:``, ``retry:`` are ignored."""
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

    def end(self) -> SseEvent | None:
        """The stream ended: an event not yet closed by a blank line, if any."""
        return self.feed("") if self._data else None
