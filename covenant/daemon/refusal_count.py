"""Count what a listener refuses: every answer of 400 or more, by listener and HTTP status.

Wrapped around a whole ASGI app (the control API, the webhook and A2A apps) rather than called at each
place an app refuses, so no refusal path can be missed, a new one included: the webhook's 401 for a bad
signature, 409 for a replay, 413 for a body over the cap, 429 for its rate, and a dispatch the daemon
refuses behind any listener (503 ``overloaded``). A JSON-RPC error of the A2A binding travels in a 200
answer and is not an HTTP refusal. Answers the HTTP server makes itself (a malformed request, a
connection over a cap) never reach the app; ``covenant_listener_closed_total`` counts the latter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from covenant.daemon.server import ASGIApp

__all__ = ["counting_refusals"]

RefusalCounter = Callable[[str, int], None]
"""``count(listener, status)``: :meth:`covenant.daemon.metrics.Metrics.http_refusal`."""


def counting_refusals(app: ASGIApp, listener: str, count: RefusalCounter) -> ASGIApp:
    """``app``, with each response of status 400 or more counted as ``listener``'s."""

    async def counted(scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        async def send_counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and int(message["status"]) >= 400:
                count(listener, int(message["status"]))
            await send(message)

        await app(scope, receive, send_counted)

    return counted
