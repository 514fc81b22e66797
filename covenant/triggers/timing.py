"""When a schedule fires next: a fixed period, or a cron expression read by cronsim (in UTC)."""

from __future__ import annotations

from datetime import UTC, datetime

from cronsim import CronSim

from covenant.triggers.config import ScheduleConfig, every_ms

__all__ = ["next_cron_ms", "next_after"]


def next_cron_ms(expression: str, after_ms: int) -> int:
    """The first time strictly after ``after_ms`` (ms since the epoch) that ``expression`` matches, in UTC."""
    start = datetime.fromtimestamp(after_ms / 1000, UTC)
    return int(next(CronSim(expression, start)).timestamp() * 1000)


def next_after(schedule: ScheduleConfig, after_ms: int) -> int:
    """The schedule's next slot after ``after_ms``: one period later, or the next cron time."""
    if schedule.every is not None:
        return after_ms + every_ms(schedule.every)
    assert schedule.cron is not None  # ScheduleConfig holds exactly one of every and cron
    return next_cron_ms(schedule.cron, after_ms)
