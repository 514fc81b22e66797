"""The replay cache refuses every replay inside the window, whatever order ids arrive in."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from covenant.policy.errors import ReplayedIntent
from covenant.policy.replay_cache import ReplayCache

WINDOW_MS = 10_000
NOW = 1_800_000_000_000


def _refused(cache: ReplayCache, intent_id: str, issued_at: int, now_ms: int) -> bool:
    try:
        cache.remember(intent_id, issued_at, now_ms)
    except ReplayedIntent:
        return True
    return False


# Each step: how far the clock moves, then an intent issued at now + skew (the client's clock).
steps = st.lists(
    st.tuples(st.integers(0, WINDOW_MS // 3), st.integers(-WINDOW_MS, WINDOW_MS)), min_size=1, max_size=60
)


@settings(max_examples=300, deadline=None)
@given(steps=steps, size=st.integers(1, 12))
def test_no_replay_inside_the_window_is_ever_accepted(steps: list[tuple[int, int]], size: int) -> None:
    """Ids arrive out of issued_at order (clients' clocks differ by up to the window) and the cache is
    often full: whatever it forgot, a replay that would pass the skew check is refused."""
    cache = ReplayCache(WINDOW_MS, size)
    accepted: list[tuple[str, int]] = []
    now = NOW
    for advance, skew in steps:
        now += advance
        intent_id = str(uuid.uuid4())
        if not _refused(cache, intent_id, now + skew, now):
            accepted.append((intent_id, now + skew))
        assert len(cache) <= size
        for old_id, issued_at in accepted:
            if abs(issued_at - now) <= WINDOW_MS:  # the skew check would let this replay through to the cache
                assert _refused(cache, old_id, issued_at, now), (old_id, issued_at, now)


@settings(max_examples=200, deadline=None)
@given(steps=steps)
def test_a_cache_that_never_fills_accepts_every_fresh_id(steps: list[tuple[int, int]]) -> None:
    cache = ReplayCache(WINDOW_MS, len(steps))
    now = NOW
    for advance, skew in steps:
        now += advance
        cache.remember(str(uuid.uuid4()), now + skew, now)


def test_expired_ids_leave_in_arrival_order() -> None:
    cache = ReplayCache(WINDOW_MS, 100)
    cache.remember("a", NOW, NOW)
    cache.remember("late", NOW - WINDOW_MS, NOW)  # a slow client clock: issued long before it arrived
    cache.remember("b", NOW + 1, NOW + 1)  # "late" has expired, but "a", which arrived before it, has not
    assert len(cache) == 3
    cache.remember("c", NOW + WINDOW_MS + 1, NOW + WINDOW_MS + 1)  # "a" and "late" leave; "b" is still inside
    assert len(cache) == 2
    assert _refused(cache, "b", NOW + 1, NOW + WINDOW_MS + 1)


def test_a_full_cache_refuses_what_it_cannot_prove_fresh_and_accepts_newer_ids() -> None:
    cache = ReplayCache(WINDOW_MS, 2)
    cache.remember("a", NOW + 500, NOW)
    cache.remember("b", NOW, NOW)
    cache.remember("c", NOW + 100, NOW)  # "a" arrived first: forgotten, the floor is its issued_at
    assert len(cache) == 2
    with pytest.raises(ReplayedIntent) as err:
        cache.remember("a", NOW + 500, NOW)
    assert err.value.details.get("cache_full") is True
    with pytest.raises(ReplayedIntent):
        cache.remember("never-seen", NOW + 400, NOW)  # at or below the floor and not remembered
    cache.remember("fresh", NOW + 501, NOW)


def test_restore_keeps_the_window_and_the_size() -> None:
    cache = ReplayCache(WINDOW_MS, 2)
    kept = cache.restore([("old", NOW - WINDOW_MS - 1), ("a", NOW - 2), ("a", NOW - 2), ("b", NOW - 1),
                          ("huge", 2**64), ("\ud800", NOW), ("c", NOW)], NOW)
    # "old" is outside the window, "huge" no accepted intent could be, "a" came twice; "a" and "b" were
    # forgotten for the last two (an id read back from a log may be any JSON string)
    assert kept == 2
    assert _refused(cache, "a", NOW - 2, NOW) and _refused(cache, "b", NOW - 1, NOW)
    assert _refused(cache, "\ud800", NOW, NOW) and _refused(cache, "c", NOW, NOW)
    cache.remember("d", NOW + 1, NOW)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        ReplayCache(0, 10)
    with pytest.raises(ValueError):
        ReplayCache(10, 0)


@pytest.mark.parametrize("window_ms, size", [(10_000, 50), (1_000, 10_000)], ids=["full", "expiring"])
def test_a_long_run_forgets_thousands_and_still_refuses_every_replay(window_ms: int, size: int) -> None:
    """Thousands of forgotten ids (a full cache, or ids that expire): the arrays behind the arrival order
    are compacted on the way, and every replay the skew check would let through is still refused."""
    cache = ReplayCache(window_ms, size)
    ids = [str(uuid.uuid4()) for _ in range(5000)]
    for i, intent_id in enumerate(ids):
        cache.remember(intent_id, NOW + 10 * i, NOW + 10 * i)
    now = NOW + 10 * (len(ids) - 1)
    assert len(cache) == min(size, window_ms // 10 + 1)
    assert len(cache._arrived_keys) < 2 * 1024 + size  # compacted, not one slot per id ever seen
    for i, intent_id in enumerate(ids):
        if now - (NOW + 10 * i) <= window_ms:
            assert _refused(cache, intent_id, NOW + 10 * i, now), i
    cache.remember(str(uuid.uuid4()), now + 1, now + 1)
