"""Next-slot computation against cronsim, and the [[schedules]] config checks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from covenant.triggers.config import ScheduleConfig, every_ms
from covenant.triggers.timing import next_after, next_cron_ms


def _ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)


def test_weekday_nine_oclock_skips_the_weekend() -> None:
    friday_after_nine = _ms(2026, 11, 20, 9, 0, 1)  # a Friday
    assert next_cron_ms("0 9 * * 1-5", friday_after_nine) == _ms(2026, 11, 23, 9, 0)  # Monday
    assert next_cron_ms("0 9 * * 1-5", _ms(2026, 11, 23, 8, 59, 59)) == _ms(2026, 11, 23, 9, 0)


def test_a_cron_time_is_strictly_after_the_slot_it_follows() -> None:
    slot = _ms(2026, 11, 23, 9, 0)
    assert next_cron_ms("0 9 * * 1-5", slot) == _ms(2026, 11, 24, 9, 0)
    assert next_cron_ms("*/15 * * * *", _ms(2026, 1, 1, 0, 14, 59)) == _ms(2026, 1, 1, 0, 15)


def test_every_is_one_period_after() -> None:
    schedule = ScheduleConfig(name="t", agent="a@local", every="10m", issuer="x")
    assert next_after(schedule, 1_000) == 1_000 + 600_000
    assert [every_ms(t) for t in ("5s", "10m", "2h")] == [5_000, 600_000, 7_200_000]


@pytest.mark.parametrize("fields, wrong", [
    ({"every": "5"}, "s, m or h"),
    ({"every": "0s"}, "s, m or h"),
    ({"every": "-5s"}, "s, m or h"),
    ({"cron": "61 * * * *"}, "cron"),
    ({"cron": "0 9 * * 1-5", "every": "5s"}, "exactly one"),
    ({}, "exactly one"),
    ({"every": "5s", "name": "../x"}, "schedule name"),
])
def test_bad_schedules_are_refused_with_the_reason(fields: dict[str, str], wrong: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ScheduleConfig(**{"name": "t", "agent": "a@local", "issuer": "x", **fields})
    assert wrong in str(caught.value)


def test_every_schedule_and_route_key_is_documented() -> None:
    from covenant.triggers.webhook_config import WebhookRoute
    from tests.conftest import REPO_ROOT

    doc = (REPO_ROOT / "docs" / "configuration.md").read_text()
    for heading, model in (("## `[[schedules]]`", ScheduleConfig), ("### `[[webhooks.routes]]`", WebhookRoute)):
        section = doc.split(heading, 1)[1].split("\n#", 1)[0]
        for name in model.model_fields:
            assert f"| `{name}` |" in section, f"{heading}: no row for {name}"


def test_bad_trigger_keys_in_covenant_toml_name_the_key(home) -> None:  # type: ignore[no-untyped-def]
    from covenant.config import load_config
    from covenant.errors import ConfigError

    home.config_path.write_text('[[schedules]]\nname = "x"\nagent = "a@local"\nevery = "5"\nissuer = "a@b"\n\n'
                                '[webhooks]\nlisten = "nope"\n\n[[webhooks.routes]]\npath = "/h"\nagent = "a"\n'
                                'issuer = "a@b"\nsecret_env = "not a name"\nrate = "5/hour"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(home)
    message = caught.value.message
    assert "schedules.0.every: '5' must be a whole number followed by s, m or h" in message
    assert ":8: [webhooks] listen: 'nope' must be HOST:PORT" in message
    assert "secret_env" in message and "not the secret" in message
    assert '"N/minute"' in message


def test_one_skipped_event_stands_for_every_slot_missed_while_down() -> None:
    from covenant.triggers.schedules import missed_slots

    every_3s = ScheduleConfig(name="t", agent="a@local", every="3s", issuer="a@b")
    assert missed_slots(every_3s, 3000, 3000) == (3000, 1)
    assert missed_slots(every_3s, 3000, 11_999) == (9000, 3)  # 3000, 6000, 9000; 12000 is not due yet
