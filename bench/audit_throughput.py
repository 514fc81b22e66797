"""Audit log throughput: signed, durable events per second, and verify speed.

Run: .venv/bin/python bench/audit_throughput.py [--events N] [--verify-records N] [--repeat N]
     [--line-walk] [--dir PATH]

Measures, in one process on the same disk:
- raw baseline: one 200-byte line per write() + fdatasync (what a naive durable log costs)
- raw baseline: one Ed25519 signature per line, no sync (per-line signatures, not durable)
- AuditLog with 1 trio writer and with 64 concurrent trio writers (each event acknowledged
  only after fdatasync and a signed checkpoint)
- verify_log over two logs of --verify-records records each, written by the writer's own code
  with fsync turned off (only to save time: the bytes are what it writes durably):
  batches of 64 events under one checkpoint (what 64 concurrent writers produce), and one
  event per checkpoint (what a lightly loaded daemon writes: half the lines are checkpoints,
  each one an Ed25519 verification).
  Each is verified with the default worker processes and in one process (median of --repeat
  runs), next to its crypto floor measured here: SHA-256 of every line plus one Ed25519
  verification per checkpoint, on one core. --line-walk adds the one-line-at-a-time walk
  (verify_log fast=False, the code before the fast scan) for comparison.
Targets (design/audit-log.md): > 10,000 events/s at 64 writers, > 100,000 records/s verify.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.format import checkpoint_message, segment_name, timestamp
from covenant.audit.store import LogFiles
from covenant.audit.verify import verify_log
from covenant.audit.writer import AuditLog
from covenant.canonical import canonical_bytes
from covenant.config import AuditConfig
from covenant.keys import verify_signature


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


def _event(w: int, i: int) -> dict[str, object]:
    return {"agent": f"agent-{w}", "intent": f"{w:04d}-{i:08d}", "decision": "allow", "missing": []}


def write_log(directory: Path, key: Ed25519PrivateKey, records: int, batch: int) -> None:
    """``records`` records in batches of ``batch`` events under one checkpoint each.

    Written by the writer's own LogFiles with fsync off (only to save time: the
    bytes are those it makes durable). Batches of 64 are what 64 concurrent
    writers produce (see the mean batch above); batches of 1 what one writer,
    or a lightly loaded daemon, produces.
    """
    files = LogFiles.open(directory, key, AuditConfig().segment_bytes, lambda _fd: None)
    try:
        for first in range(0, records * batch // (batch + 1), batch):
            files.append(
                [("policy.decision", canonical_bytes(_event(i % 64, i)), timestamp()) for i in range(first, first + batch)]
            )
        files.write_head()
    finally:
        files.close()


def crypto_floor(directory: Path, key: Ed25519PrivateKey) -> tuple[float, int, int]:
    """(seconds, lines, checkpoints): SHA-256 of every line and one signature check per checkpoint."""
    public = key.public_key()
    lines = checkpoints = 0
    took = 0.0
    index = 0
    while (directory / segment_name(index)).exists():
        data = (directory / segment_name(index)).read_bytes().split(b"\n")[:-1]
        sigs = []
        for line in data:
            if b'"type":"audit.checkpoint"' in line:
                d = json.loads(line)["data"]
                sigs.append((bytes.fromhex(d["sig"]), checkpoint_message(d["log"], d["seq"], d["hash"])))
        started = time.perf_counter()
        for line in data:
            hashlib.sha256(line).hexdigest()
        for sig, message in sigs:
            verify_signature(public, sig, message)
        took += time.perf_counter() - started
        lines += len(data)
        checkpoints += len(sigs)
        index += 1
    return took, lines, checkpoints


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (verify's workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def time_verify(directory: Path, key: Ed25519PrivateKey, repeat: int, **options: object) -> tuple[float, float, int]:
    """(median wall seconds, median CPU seconds, records) of ``repeat`` verify_log runs.

    CPU seconds say what the work costs when other jobs share the machine.
    """
    walls, cpus = [], []
    records = 0
    for _ in range(repeat):
        started, cpu = time.perf_counter(), _cpu_seconds()
        report = verify_log(directory, key.public_key(), **options)  # type: ignore[arg-type]
        walls.append(time.perf_counter() - started)
        cpus.append(_cpu_seconds() - cpu)
        assert report.ok, report.first_problem
        records = report.records
    return statistics.median(walls), statistics.median(cpus), records


def verify_figures(base: Path, key: Ed25519PrivateKey, records: int, repeat: int, line_walk: bool) -> None:
    for label, batch in (("batches of 64", 64), ("one event per checkpoint", 1)):
        directory = base / f"verify-{batch}"
        write_log(directory, key, records, batch)
        floor_s, lines, checkpoints = crypto_floor(directory, key)
        size = sum(p.stat().st_size for p in directory.glob("audit-*.jsonl"))
        print(
            f"verify log '{label}': {lines:,} records, {checkpoints:,} checkpoints "
            f"({lines / checkpoints:.1f} records per checkpoint), {size / 1e6:.0f} MB"
        )
        print(f"  {'crypto floor, 1 core (sha256 + Ed25519)':<42}{lines / floor_s:>10,.0f} records/s")
        runs: list[tuple[str, dict[str, object], int]] = [
            (f"verify_log, {len(os.sched_getaffinity(0))} worker processes", {}, repeat),
            ("verify_log, 1 process", {"jobs": 1}, repeat),
        ]
        if line_walk:
            runs.append(("line-by-line walk (fast=False), once", {"fast": False}, 1))
        for name, options, times in runs:
            took, cpu, n = time_verify(directory, key, times, **options)
            rate = n / took
            print(
                f"  {name:<42}{rate:>10,.0f} records/s ({took:.2f} s, {rate * floor_s / lines:.2f}x floor, "
                f"{n / cpu:,.0f} per CPU-second)  target > 100,000: {'met' if rate > 100_000 else 'NOT met'}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=40_000, help="events for the 64-writer run")
    parser.add_argument("--verify-records", type=int, default=200_000, help="records in each verify log")
    parser.add_argument("--repeat", type=int, default=3, help="verify runs per figure (the median is printed)")
    parser.add_argument("--line-walk", action="store_true", help="also time the one-line-at-a-time walk")
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to measure (default: a temp dir)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="covenant-audit-bench-", dir=args.dir))
    key = Ed25519PrivateKey.generate()
    try:
        print(f"disk: {base}   load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        # Verify first: trio leaves idle worker threads behind, and verify forks
        # its scan workers only from a single-threaded process.
        verify_figures(base, key, args.verify_records, args.repeat, args.line_walk)
        raw_sync = raw_fsync_per_line(base, 2_000)
        raw_sign = raw_sign_per_line(key, 20_000)
        one, one_batch = audit_rate(base / "one", key, 1, 2_000)
        many, many_batch = audit_rate(base / "many", key, 64, args.events)
        print(f"raw write+fdatasync per line      {raw_sync:>10,.0f} lines/s   (durable, unsigned)")
        print(f"raw Ed25519 sign per line         {raw_sign:>10,.0f} lines/s   (signed, not durable)")
        print(f"AuditLog, 1 writer                {one:>10,.0f} events/s  (mean batch {one_batch:.1f})  "
              f"{one / raw_sync:.2f}x raw fsync")
        print(f"AuditLog, 64 concurrent writers   {many:>10,.0f} events/s  (mean batch {many_batch:.1f})  "
              f"{many / raw_sync:.2f}x raw fsync   target > 10,000: {'met' if many > 10_000 else 'NOT met'}")
        assert verify_log(base / "many", key.public_key()).ok
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
