"""What replay protection across restarts costs at daemon start (issue 12 item 6).

The dispatch path pays nothing: the ids come back from the audit log, whose
``intent.received`` events are durable before any agent starts. The cost is
at start: reading the log backwards over the last 2 x skew_s + 60 s and
refilling the verifier. This writes a real audit log with the real writer
(``--dispatches`` dispatches of five events each, as the daemon writes them,
all inside the window), then times, in one run:

1. raw baseline: reading every segment file whole and splitting it into lines;
2. ``records_since`` (the backwards reader) for ``intent.received``;
3. ``IntentVerifier.restore`` of the ids found.

    .venv/bin/python bench/replay_window.py [--dispatches N] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from covenant.audit.recent import records_since  # noqa: E402
from covenant.audit.store import list_segments  # noqa: E402
from covenant.audit.format import segment_name  # noqa: E402
from covenant.audit.writer import AuditLog  # noqa: E402
from covenant.clock import now_ms  # noqa: E402
from covenant.config import AuditConfig  # noqa: E402
from covenant.policy.intents import IntentVerifier  # noqa: E402

SKEW_S = 300


async def write_log(directory: Path, dispatches: int) -> None:
    """Five events per dispatch, in group commits of 100 dispatches, like a busy daemon."""
    key = Ed25519PrivateKey.generate()
    async with AuditLog.open(directory, key, AuditConfig(batch_max=512)) as log:
        for start in range(0, dispatches, 100):
            events = []
            for n in range(start, min(start + 100, dispatches)):
                intent = f"{n:08d}-0000-4000-8000-000000000000"
                events += [
                    ("intent.received", {"intent": intent, "issuer": "ab" * 32, "issued_at": now_ms(), "dry_run": False,
                                         "priority": "normal", "parent": None, "agent_requested": None,
                                         "issuer_display": "bench@host", "text": {"sha256": "cd" * 32, "len": 20}}),
                    ("policy.decision", {"intent": intent, "agent": "echo@bench", "allowed": True, "decision": "allow"}),
                    ("agent.spawned", {"intent": intent, "agent": "echo@bench", "pid": 1, "argv": ["x"]}),
                    ("agent.exited", {"intent": intent, "agent": "echo@bench", "outcome": "ok", "duration_ms": 5}),
                    ("intent.completed", {"intent": intent, "agent": "echo@bench", "outcome": "ok", "status": "ok"}),
                ]
            await log.record_many(events)


def raw_read(directory: Path) -> int:
    lines = 0
    for index in list_segments(directory):
        lines += len((directory / segment_name(index)).read_bytes().split(b"\n"))
    return lines


def timed(fn, rounds: int) -> tuple[float, object]:
    samples, result = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dispatches", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "audit"
        trio.run(write_log, directory, args.dispatches)
        size = sum((directory / segment_name(i)).stat().st_size for i in list_segments(directory))
        since = now_ms() - 2 * SKEW_S * 1000 - 60_000
        raw_s, lines = timed(lambda: raw_read(directory), args.rounds)
        read_s, records = timed(lambda: records_since(directory, since, frozenset({"intent.received"})), args.rounds)
        pairs = [(r["data"]["intent"], r["data"]["issued_at"]) for r in records]
        restore_s, kept = timed(lambda: IntentVerifier(SKEW_S, 100_000).restore(pairs, now_ms()), args.rounds)
    print(f"audit log: {size / 1e6:.1f} MB, {lines} lines, {args.dispatches} dispatches inside the window")
    print(f"raw read + split of every segment: {raw_s * 1000:.1f} ms")
    print(f"records_since (backwards, intent.received only): {read_s * 1000:.1f} ms "
          f"({len(records)} records; {read_s / raw_s:.1f}x the raw read)")
    print(f"IntentVerifier.restore: {restore_s * 1000:.1f} ms ({kept} ids)")
    print(f"start-up cost: {(read_s + restore_s) * 1000:.1f} ms, "
          f"{(read_s + restore_s) / args.dispatches * 1e6:.1f} us per dispatch in the window")


if __name__ == "__main__":
    main()
