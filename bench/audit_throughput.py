"""Audit log throughput: signed, durable events per second, and verify speed.

Run: .venv/bin/python bench/audit_throughput.py [--events N] [--dir PATH]

Measures, in one process on the same disk:
- raw baseline: one 200-byte line per write() + fdatasync (what a naive durable log costs)
- raw baseline: one Ed25519 signature per line, no sync (per-line signatures, not durable)
- AuditLog with 1 trio writer and with 64 concurrent trio writers (each event acknowledged
  only after fdatasync and a signed checkpoint)
- verify_log over the log the 64-writer run produced
Targets (design/audit-log.md): > 10,000 events/s at 64 writers, > 100,000 records/s verify.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.verify import verify_log
from covenant.audit.writer import AuditLog
from covenant.config import AuditConfig


def raw_fsync_per_line(directory: Path, n: int) -> float:
    fd = os.open(directory / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    line = b"x" * 199 + b"\n"
    started = time.perf_counter()
    for _ in range(n):
        os.write(fd, line)
        os.fdatasync(fd)
    took = time.perf_counter() - started
    os.close(fd)
    return n / took


def raw_sign_per_line(key: Ed25519PrivateKey, n: int) -> float:
    line = b"x" * 200
    started = time.perf_counter()
    for _ in range(n):
        key.sign(line)
    return n / (time.perf_counter() - started)


def audit_rate(directory: Path, key: Ed25519PrivateKey, writers: int, n: int) -> tuple[float, float]:
    """(events/s, mean records per batch) for ``writers`` concurrent trio tasks writing ``n`` events."""
    batches: list[int] = []

    async def main() -> float:
        async with AuditLog.open(directory, key, AuditConfig(), on_batch=lambda k, _s: batches.append(k)) as log:
            per_writer = n // writers

            async def writer(w: int) -> None:
                for i in range(per_writer):
                    await log.record(
                        "policy.decision",
                        {"agent": f"agent-{w}", "intent": f"{w:04d}-{i:08d}", "decision": "allow", "missing": []},
                    )

            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                for w in range(writers):
                    nursery.start_soon(writer, w)
            return (per_writer * writers) / (trio.current_time() - started)

    rate = trio.run(main)
    events = [b for b in batches[1:]]  # the first batch is the opening checkpoint's neighbour
    return rate, (sum(events) / len(events)) if events else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=40_000, help="events for the 64-writer run")
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to measure (default: a temp dir)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="covenant-audit-bench-", dir=args.dir))
    key = Ed25519PrivateKey.generate()
    try:
        raw_sync = raw_fsync_per_line(base, 2_000)
        raw_sign = raw_sign_per_line(key, 20_000)
        one, one_batch = audit_rate(base / "one", key, 1, 2_000)
        many, many_batch = audit_rate(base / "many", key, 64, args.events)
        started = time.perf_counter()
        report = verify_log(base / "many", key.public_key())
        verify_s = time.perf_counter() - started
        assert report.ok, report.first_problem
        size = sum(p.stat().st_size for p in (base / "many").glob("audit-*.jsonl"))
        print(f"disk: {base}")
        print(f"raw write+fdatasync per line      {raw_sync:>10,.0f} lines/s   (durable, unsigned)")
        print(f"raw Ed25519 sign per line         {raw_sign:>10,.0f} lines/s   (signed, not durable)")
        print(f"AuditLog, 1 writer                {one:>10,.0f} events/s  (mean batch {one_batch:.1f})  "
              f"{one / raw_sync:.2f}x raw fsync")
        print(f"AuditLog, 64 concurrent writers   {many:>10,.0f} events/s  (mean batch {many_batch:.1f})  "
              f"{many / raw_sync:.2f}x raw fsync   target > 10,000: {'met' if many > 10_000 else 'NOT met'}")
        rate = report.records / verify_s
        print(f"verify_log                        {rate:>10,.0f} records/s ({report.records:,} records, "
              f"{size / 1e6:.1f} MB, {verify_s:.2f} s)  target > 100,000: {'met' if rate > 100_000 else 'NOT met'}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
