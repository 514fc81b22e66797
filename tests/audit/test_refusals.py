"""The refusal throttle: a bounded number of records per kind a minute, the rest counted and carried."""

from __future__ import annotations

import pytest

from covenant.audit.refusals import RefusalThrottle


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_records_up_to_the_cap_then_carries_the_count_into_the_next_minute() -> None:
    clock = _Clock()
    throttle = RefusalThrottle(2, clock=clock)
    assert [throttle.admit("bad") for _ in range(5)] == [0, 0, None, None, None]
    assert throttle.admit("other") == 0  # kinds are counted apart
    clock.now += 59.9
    assert throttle.admit("bad") is None
    clock.now += 0.1
    assert throttle.admit("bad") == 4  # the four left out, carried by the first record of the new minute
    assert throttle.admit("bad") == 0
    assert throttle.admit("bad") is None


def test_a_count_survives_a_quiet_minute() -> None:
    clock = _Clock()
    throttle = RefusalThrottle(1, clock=clock)
    assert [throttle.admit("k") for _ in range(3)] == [0, None, None]
    clock.now += 600
    assert throttle.admit("k") == 2


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        RefusalThrottle(0)
