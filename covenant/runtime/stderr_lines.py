"""An agent's stderr, cut into lines for the ``covenant.agent`` log as its chunks arrive."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["StderrLines", "LOG_LINE_MAX"]

agent_log = logging.getLogger("covenant.agent")

LOG_LINE_MAX = 4096
"""Longer lines are logged in parts of this many bytes (a dispatch record's stderr tail keeps the bytes)."""


class StderrLines:
    """Logs each line of one process's stderr as ``message`` with ``fields``; never holds more than one line."""

    def __init__(self, message: str, fields: dict[str, Any]) -> None:
        self._message = message
        self._fields = fields
        self._pending = b""
        """The start of a line not ended yet."""

    def feed(self, data: bytes) -> None:
        *lines, self._pending = (self._pending + data).split(b"\n")
        if len(self._pending) > LOG_LINE_MAX:
            lines.append(self._pending)
            self._pending = b""
        for raw in lines:
            self._log(raw)

    def flush(self) -> None:
        """Log the last line even though it never ended (the stream is over)."""
        if self._pending:
            self._log(self._pending)
            self._pending = b""

    def _log(self, raw: bytes) -> None:
        text = raw[:LOG_LINE_MAX].decode("utf-8", "replace").rstrip("\r")
        agent_log.info(self._message, extra={**self._fields, "line": text})
