"""A process's stderr, cut into lines for the ``covenant.agent`` log as its chunks arrive.

Every process covenant starts for an agent (its run, its Rune replica, its
stdio MCP servers) writes here. The log is the operator's and the daemon's
CPU is everyone's, so each process gets a budget of lines: a token bucket,
``burst`` lines at once and ``lines_per_s`` after that. Lines beyond it are
not logged; their bytes are counted and the count is logged (at most every
:data:`REPORT_EVERY_S`, and when the stream ends). The reader also waits
:meth:`StderrLines.pause_s` before its next read while the budget is spent,
so a process that writes as fast as it can is read a pipe's worth at a time,
``lines_per_s`` times a second, and waits on its full pipe in between.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from covenant.ratelimit import TokenBucket

if TYPE_CHECKING:
    from covenant.config import RuntimeConfig

__all__ = ["StderrLines", "LOG_LINE_MAX", "REPORT_EVERY_S", "agent_log"]

agent_log = logging.getLogger("covenant.agent")

LOG_LINE_MAX = 4096
"""Longer lines are logged in parts of this many bytes (a dispatch record's stderr tail keeps the bytes)."""

REPORT_EVERY_S = 10.0
"""Least time between two ``… suppressed`` lines of one stream (a last one comes when it ends)."""


class StderrLines:
    """Logs each line of one process's stderr as ``message`` with ``fields``, within a budget of lines.

    Never holds more than one part of a line. ``dropped_bytes`` counts the
    bytes over the budget, newlines included.
    """

    def __init__(
        self, message: str, fields: dict[str, Any], *, lines_per_s: int, burst: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._message = message
        self._fields = fields
        self._clock = clock
        self._budget = TokenBucket(lines_per_s, burst, clock)
        self._pending = b""
        """The start of a line not ended yet (at most one part)."""
        self.dropped_bytes = 0
        self._unreported = 0
        """Dropped bytes not yet named by a ``suppressed`` line."""
        self._reported_at = float("-inf")

    @classmethod
    def within(cls, runtime: "RuntimeConfig", message: str, fields: dict[str, Any]) -> "StderrLines":
        """With the budget of ``[runtime] stderr_log_burst`` and ``stderr_log_lines_per_s``."""
        return cls(message, fields, lines_per_s=runtime.stderr_log_lines_per_s, burst=runtime.stderr_log_burst)

    def feed(self, data: bytes) -> None:
        if self._budget.empty():
            self._drop_all_but_the_unended(data)
            return
        *lines, pending = (self._pending + data).split(b"\n")
        while len(pending) > LOG_LINE_MAX:
            lines.append(pending[:LOG_LINE_MAX])
            pending = pending[LOG_LINE_MAX:]
        self._pending = pending
        for raw in lines:
            for start in range(0, len(raw) or 1, LOG_LINE_MAX):
                self._offer(raw[start : start + LOG_LINE_MAX])

    def flush(self) -> None:
        """Log the last line even though it never ended (the stream is over), and what was dropped."""
        if self._pending:
            self._offer(self._pending)
            self._pending = b""
        self._report()

    def pause_s(self) -> float:
        """Seconds until the next line may be logged: how long the reader should wait before reading more."""
        return self._budget.wait_s()

    def _drop_all_but_the_unended(self, data: bytes) -> None:
        """Over budget: drop what this chunk ends; keep the unended tail, at most one part of it."""
        end = data.rfind(b"\n")
        if end < 0:
            pending = self._pending + data
        else:
            self._drop(len(self._pending) + end + 1)
            pending = data[end + 1 :]
        parts = (len(pending) - 1) // LOG_LINE_MAX if pending else 0
        self._drop(parts * LOG_LINE_MAX)
        self._pending = pending[parts * LOG_LINE_MAX :]

    def _offer(self, raw: bytes) -> None:
        if not self._budget.take():
            self._drop(len(raw) + 1)
            return
        if self._unreported and self._clock() - self._reported_at >= REPORT_EVERY_S:
            self._report()
        agent_log.info(self._message, extra={**self._fields, "line": raw.decode("utf-8", "replace").rstrip("\r")})

    def _drop(self, count: int) -> None:
        self.dropped_bytes += count
        self._unreported += count

    def _report(self) -> None:
        if self._unreported:
            agent_log.warning(
                f"{self._message} suppressed",
                extra={**self._fields, "dropped_bytes": self._unreported, "lines_per_s": self._budget.per_s,
                       "burst": self._budget.burst},
            )
            self._unreported = 0
            self._reported_at = self._clock()
