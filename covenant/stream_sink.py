"""Where a streamed dispatch's events go: the control API's and A2A's server-sent events alike.

Below every front door (control socket, A2A) and the dispatch path that feeds it, so each can hand
the daemon its own sink without importing the others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Emit", "StreamSink"]

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Sends one event (its name and JSON data) to whoever listens."""


class StreamSink:
    """Where a streamed dispatch's events go; ``open`` is called once, before the first event."""

    def __init__(self, open_stream: Callable[[], Awaitable[None]], emit: Emit) -> None:
        self._open_stream = open_stream
        self._emit = emit
        self.opened = False
        self.lost = False
        """The client went away: later events are dropped (the intent still finishes and is recorded)."""

    async def open(self) -> None:
        if not self.opened:
            self.opened = True
            await self._open_stream()

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        if self.lost:
            return
        try:
            await self.open()
            await self._emit(event, data)
        except Exception:  # whatever the server raises for a client that hung up
            self.lost = True
