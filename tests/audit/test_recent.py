"""Reading the newest records backwards (the daemon's replay window at start)."""

from __future__ import annotations

import json
from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.recent import records_since
from covenant.audit.writer import AuditLog
from covenant.clock import ms_from_iso, now_ms
from covenant.config import AuditConfig
from tests.audit.conftest import read_lines, segment


async def _write(directory: Path, key: Ed25519PrivateKey, count: int, **config: object) -> None:
    async with AuditLog.open(directory, key, AuditConfig(**config)) as log:
        for n in range(count):
            await log.record("intent.received", {"intent": f"i{n}", "issued_at": n, "pad": "x" * 200})
            await log.record("agent.exited", {"intent": f"i{n}", "outcome": "ok"})


def test_records_since_reads_backwards_across_segments_and_stops_at_the_cutoff(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    directory = tmp_path / "audit"
    trio.run(lambda: _write(directory, key, 300, segment_bytes=16 * 1024))
    assert segment(directory, 3).exists()  # several segments
    everything = records_since(directory, 0, frozenset({"intent.received"}))
    assert [r["data"]["intent"] for r in everything] == [f"i{n}" for n in reversed(range(300))]

    cutoff_line = next(line for line in read_lines(segment(directory, 2)) if b'"intent.received"' in line)
    cutoff = ms_from_iso(json.loads(cutoff_line)["ts"])
    recent = records_since(directory, cutoff, frozenset({"intent.received"}))
    assert recent and all(ms_from_iso(r["ts"]) >= cutoff for r in recent)
    assert records_since(directory, now_ms() + 60_000, frozenset({"intent.received"})) == []


def test_a_torn_tail_is_skipped(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    directory = tmp_path / "audit"
    trio.run(lambda: _write(directory, key, 3))
    with open(segment(directory), "ab") as f:
        f.write(b'{"data":{"intent":"torn"')
    assert [r["data"]["intent"] for r in records_since(directory, 0, frozenset({"intent.received"}))] == ["i2", "i1", "i0"]
