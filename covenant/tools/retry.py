"""``retry_policy`` and ``timeout_ms`` of one tool call, never past the intent's deadline."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack

import trio

from covenant.manifest.tools import RetryPolicy
from covenant.tools.result import ToolResult

__all__ = ["run_with_retries", "backoff_s", "BACKOFF_BASE_MS", "BACKOFF_MAX_MS"]

BACKOFF_BASE_MS = 200
BACKOFF_MAX_MS = 5000

Attempt = Callable[[float], Awaitable[ToolResult]]
"""One attempt, given the trio time it must end by; returns its result (never raises for the tool's fault)."""

Place = Callable[[], AbstractAsyncContextManager[None]]
"""A place to run an attempt in, held for the attempt (``ToolServices.run_slot``); entering it may wait."""


def backoff_s(policy: RetryPolicy, retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (1 = the second attempt)."""
    if policy.backoff == "none":
        return 0.0
    if policy.backoff == "fixed":
        return BACKOFF_BASE_MS / 1000
    return min(BACKOFF_BASE_MS * 2 ** (retry - 1), BACKOFF_MAX_MS) / 1000


def _timed_out(timeout_ms: int, cut_by_intent: bool) -> ToolResult:
    if cut_by_intent:
        return ToolResult.failure("tool_timeout", "the intent's time ran out before the tool finished")
    return ToolResult.failure("tool_timeout", f"the tool did not finish within its timeout_ms of {timeout_ms} ms")


async def run_with_retries(
    attempt: Attempt, *, policy: RetryPolicy, timeout_ms: int, deadline: float, place: Place | None = None
) -> tuple[ToolResult, int]:
    """Run ``attempt`` until it succeeds, fails with a code not in ``policy.on``, or attempts run out.

    Each attempt ends by ``min(now + timeout_ms, deadline)``; an attempt still
    running then is cancelled (a process tool's tree is torn down first) and
    counts as ``tool_timeout``. A retry whose backoff would reach the
    deadline is not made. Returns the last result and the attempts made.

    With ``place``, each attempt first waits for one (bounded by the deadline
    only) and holds it while it runs: ``timeout_ms`` counts from when it got
    one, so calls queued behind others of the same agent are not timed out by
    their wait; the backoff between attempts holds none.
    """
    made = 0
    result = ToolResult.failure("tool_timeout", "the intent had no time left to run the tool")
    while made < policy.max_attempts:
        if made:
            if result.error_code not in policy.on:
                break
            pause = backoff_s(policy, made)
            if trio.current_time() + pause >= deadline:
                break
            await trio.sleep(pause)
        if trio.current_time() >= deadline:
            break
        made += 1
        async with AsyncExitStack() as held:
            if place is not None:
                with trio.move_on_at(deadline) as waiting:
                    await held.enter_async_context(place())
                if waiting.cancelled_caught:  # the intent's time ran out while it waited
                    return _timed_out(timeout_ms, cut_by_intent=True), made
            ends = min(trio.current_time() + timeout_ms / 1000, deadline)
            with trio.move_on_at(ends) as scope:
                result = await attempt(ends)
        if scope.cancelled_caught:
            result = _timed_out(timeout_ms, cut_by_intent=ends >= deadline)
        if result.ok:
            break
    return result, made
