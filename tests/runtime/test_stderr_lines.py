"""Cutting a process's stderr into log lines: chunks split anywhere, a long line in parts, the last one
unended; and the budget of lines a process may log."""

from __future__ import annotations

import pytest

from covenant.runtime.stderr_lines import LOG_LINE_MAX, REPORT_EVERY_S, StderrLines


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.line for r in caplog.records if r.getMessage() == "replica stderr" and r.agent == "a@1"]


def suppressed(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [r.dropped_bytes for r in caplog.records if r.getMessage() == "replica stderr suppressed"]


def unlimited() -> StderrLines:
    return StderrLines("replica stderr", {"agent": "a@1"}, lines_per_s=1_000_000, burst=1_000_000)


def test_lines_across_chunks_and_the_unended_last_one(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="covenant.agent")
    lines = unlimited()
    for chunk in (b"one\r\ntw", b"o\n", b"\nthr", b"ee"):
        lines.feed(chunk)
    assert logged(caplog) == ["one", "two", ""]
    lines.flush()
    lines.flush()
    assert logged(caplog) == ["one", "two", "", "three"]


def test_a_line_that_never_ends_is_logged_in_parts_and_not_held(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="covenant.agent")
    lines = unlimited()
    for _ in range(100):
        lines.feed(b"x" * 1000)
    lines.flush()
    assert logged(caplog) == ["x" * LOG_LINE_MAX] * (100_000 // LOG_LINE_MAX) + ["x" * (100_000 % LOG_LINE_MAX)]


def test_a_long_ended_line_is_logged_in_parts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="covenant.agent")
    lines = unlimited()
    lines.feed(b"y" * (LOG_LINE_MAX + 10) + b"\nz\n")
    assert logged(caplog) == ["y" * LOG_LINE_MAX, "y" * 10, "z"]


def test_past_its_burst_a_stream_logs_its_rate_and_counts_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="covenant.agent")
    clock = Clock()
    lines = StderrLines("replica stderr", {"agent": "a@1"}, lines_per_s=2, burst=3, clock=clock)
    lines.feed(b"".join(b"line %d\n" % i for i in range(10)))  # 7 bytes each
    assert logged(caplog) == ["line 0", "line 1", "line 2"]
    assert lines.dropped_bytes == 7 * 7 and suppressed(caplog) == []
    assert lines.pause_s() == pytest.approx(0.5)  # the next token comes in half a second
    lines.feed(b"more\nand more\n")  # no token yet: counted without being cut into lines
    assert lines.dropped_bytes == 49 + 14
    clock.now += 1.0  # two tokens
    assert lines.pause_s() == 0
    lines.feed(b"a\nb\nc\n")
    assert logged(caplog)[3:] == ["a", "b"]
    assert suppressed(caplog) == [63]  # named once logging resumes
    clock.now += 1.0
    lines.feed(b"d\ne\nf\n")  # within REPORT_EVERY_S of the last report: "f" and "c" are not named yet
    assert logged(caplog)[5:] == ["d", "e"] and suppressed(caplog) == [63]
    lines.flush()
    assert suppressed(caplog) == [63, 4]
    assert lines.dropped_bytes == 67


def test_reports_of_a_long_flood_come_at_most_every_report_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="covenant.agent")
    clock = Clock()
    lines = StderrLines("replica stderr", {"agent": "a@1"}, lines_per_s=8, burst=1, clock=clock)
    ticks = int(3 * REPORT_EVERY_S * 8)
    for _ in range(ticks):
        lines.feed(b"spam\n" * 100)
        clock.now += 0.125
    assert 3 <= len(suppressed(caplog)) <= 4
    assert len(logged(caplog)) == ticks  # one line a tick: the rate


def test_over_budget_an_unended_line_is_held_to_one_part(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="covenant.agent")
    clock = Clock()
    lines = StderrLines("replica stderr", {"agent": "a@1"}, lines_per_s=1, burst=1, clock=clock)
    lines.feed(b"first\n")
    for _ in range(50):
        lines.feed(b"z" * 1000)
    clock.now += 1.0
    lines.feed(b"\n")
    assert logged(caplog) == ["first", "z" * (50_000 % LOG_LINE_MAX)]
    lines.flush()
    assert lines.dropped_bytes == 50_000 - 50_000 % LOG_LINE_MAX == suppressed(caplog)[0]
