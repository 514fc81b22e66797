"""What remembering accepted intent ids costs: memory per id and time per dispatch (issue 17).

The daemon keeps the ids of the last ``skew_s`` window, up to ``policy.replay_cache`` (100,000 by
default), in :class:`covenant.policy.replay_cache.ReplayCache`. In one run, for ``--ids`` fresh
UUID4 ids (the shape ``covenant dispatch`` sends) inside one window:

1. raw baseline: a plain ``set`` of the id strings, which keeps the text of every id and can neither
   expire nor bound anything;
2. the replay cache.

Memory is what tracemalloc counts as still allocated once all ids are in, per id; the ids' text is
counted for the baseline (the set keeps it alive) and not for the cache (it keeps a hash). Time is
per ``remember`` (or ``add``), the best of ``--rounds`` rounds, without tracemalloc.

    .venv/bin/python bench/replay_cache.py [--ids N] [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from covenant.policy.replay_cache import ReplayCache  # noqa: E402

NOW_MS = 1_800_000_000_000
WINDOW_MS = 300_000


def fill_set(ids: list[str]) -> Callable[[], object]:
    def fill() -> object:
        seen: set[str] = set()
        for intent_id in ids:
            seen.add(intent_id)
        return seen

    return fill


def fill_cache(ids: list[str]) -> Callable[[], object]:
    def fill() -> object:
        cache = ReplayCache(WINDOW_MS, len(ids))
        for offset, intent_id in enumerate(ids):
            cache.remember(intent_id, NOW_MS + offset % WINDOW_MS, NOW_MS)
        return cache

    return fill


def bytes_per_id(fill: Callable[[], object], ids: list[str], *, count_text: bool) -> float:
    gc.collect()
    tracemalloc.start()
    kept = fill()
    allocated = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    text = sum(sys.getsizeof(i) for i in ids) if count_text else 0  # allocated before tracing began
    return (allocated + text) / len(ids)


def micros_per_id(fill: Callable[[], object], ids: list[str], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        started = time.perf_counter()
        fill()
        best = min(best, time.perf_counter() - started)
    return best / len(ids) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=100_000, help="intent ids inside one window")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (the best is kept)")
    args = parser.parse_args()
    ids = [str(uuid.uuid4()) for _ in range(args.ids)]
    raw_bytes = bytes_per_id(fill_set(ids), ids, count_text=True)
    cache_bytes = bytes_per_id(fill_cache(ids), ids, count_text=False)
    raw_us = micros_per_id(fill_set(ids), ids, args.rounds)
    cache_us = micros_per_id(fill_cache(ids), ids, args.rounds)
    print(f"{args.ids:,} ids; best of {args.rounds} rounds for the times")
    print("| | bytes per id | µs per id |")
    print("|---|---:|---:|")
    print(f"| raw: a set of the id strings | {raw_bytes:.0f} | {raw_us:.2f} |")
    print(f"| ReplayCache | {cache_bytes:.0f} | {cache_us:.2f} |")
    print(f"| ratio | {cache_bytes / raw_bytes:.2f} | {cache_us / raw_us:.2f} |")


if __name__ == "__main__":
    main()
