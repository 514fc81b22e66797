"""Cutting a process's stderr into log lines: chunks split anywhere, a long line in parts, the last one unended."""

from __future__ import annotations

import pytest

from covenant.runtime.stderr_lines import LOG_LINE_MAX, StderrLines


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.line for r in caplog.records if r.getMessage() == "replica stderr" and r.agent == "a@1"]


def test_lines_across_chunks_and_the_unended_last_one(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="covenant.agent")
    lines = StderrLines("replica stderr", {"agent": "a@1"})
    for chunk in (b"one\r\ntw", b"o\n", b"\nthr", b"ee"):
        lines.feed(chunk)
    assert logged(caplog) == ["one", "two", ""]
    lines.flush()
    lines.flush()
    assert logged(caplog) == ["one", "two", "", "three"]


def test_a_line_that_never_ends_is_logged_in_parts_and_not_held(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="covenant.agent")
    lines = StderrLines("replica stderr", {"agent": "a@1"})
    for _ in range(100):
        lines.feed(b"x" * 1000)
    parts = logged(caplog)
    assert len(parts) >= 100_000 // (LOG_LINE_MAX + 1000) and all(len(p) <= LOG_LINE_MAX for p in parts)
    lines.flush()
    assert sum(1 for _ in logged(caplog)) <= 100_000 // LOG_LINE_MAX + 1
