"""``[[schedules]]`` in covenant.toml: one schedule per table (docs/triggers.md)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from cronsim import CronSim, CronSimError
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

__all__ = ["ScheduleConfig", "every_ms", "SCHEDULE_NAME"]

SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_EVERY = re.compile(r"^([1-9][0-9]{0,6})(s|m|h)$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000}


def every_ms(text: str) -> int:
    """``"5s"`` / ``"10m"`` / ``"2h"`` in milliseconds; ValueError for anything else."""
    match = _EVERY.match(text)
    if match is None:
        raise ValueError(f"{text!r} must be a whole number followed by s, m or h, e.g. \"5s\", \"10m\", \"2h\"")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def _every(text: str) -> str:
    every_ms(text)
    return text


def _cron(text: str) -> str:
    try:
        CronSim(text, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise ValueError(f"{text!r} is not a 5-field cron expression ({exc})") from None
    return text


def _name(text: str) -> str:
    if not SCHEDULE_NAME.match(text):
        raise ValueError(f"{text!r}: a schedule name is 1-64 of A-Z a-z 0-9 _ . - starting with a letter or digit")
    return text


class ScheduleConfig(BaseModel):
    """``[[schedules]]``: run ``agent`` with ``input`` every period or at cron times, for ``issuer``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, AfterValidator(_name)] = Field(description="unique; audited as `schedule` in schedule.fire")
    agent: str = Field(min_length=1, description="the agent id to dispatch to, e.g. digest@local")
    input: str = Field("", description="the intent text of every firing")
    every: Annotated[str, AfterValidator(_every)] | None = Field(None, description='period: "5s", "10m", "2h"')
    cron: Annotated[str, AfterValidator(_cron)] | None = Field(
        None, description='5-field cron expression in UTC, e.g. "0 9 * * 1-5"')
    issuer: str = Field(min_length=1, description="display name in identities.toml; its grants decide each firing")
    catch_up: bool = Field(False, description="a fire missed while the daemon was down runs once at start")

    @model_validator(mode="after")
    def _one_timing(self) -> "ScheduleConfig":
        if (self.every is None) == (self.cron is None):
            raise ValueError(f"schedule {self.name!r}: set exactly one of every or cron")
        return self
