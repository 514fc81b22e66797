"""Server-sent events, as both providers frame their streams (``event:``/``data:`` lines, blank line ends one)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

__all__ = ["SseEvent", "iter_sse"]


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str


async def iter_sse(lines: AsyncIterator[str]) -> AsyncIterator[SseEvent]:
    """Events from a response's text lines; comments and ``id:``/``retry:`` fields are ignored."""
    event = "message"
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield SseEvent(event, "\n".join(data))
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    if data:
        yield SseEvent(event, "\n".join(data))
