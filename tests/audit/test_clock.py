"""The one timestamp format (audit records, dispatch records, logs): the cached second never leaks
into another second's stamp, in any order of calls."""

from __future__ import annotations

import time

from covenant.clock import iso_ms, ms_from_iso


def _reference(ms: int) -> str:
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def test_iso_ms_matches_strftime_across_second_boundaries_in_any_order() -> None:
    base = 1738324799_000  # 2025-01-31T11:59:59Z
    stamps = [base + delta for delta in (0, 999, 1000, 1, 86_400_000, 998, 1001, -1, 0)]
    for ms in stamps:
        assert iso_ms(ms) == _reference(ms)
        assert ms_from_iso(iso_ms(ms)) == ms
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
