"""The dispatch store: append-only, crash-tolerant, newest first."""

from __future__ import annotations

from pathlib import Path

from covenant.runtime.outcome import DispatchRecord
from covenant.runtime.records import DispatchStore


def record(intent_id: str, agent: str = "a@local", outcome: str = "ok") -> DispatchRecord:
    return DispatchRecord(
        intent_id=intent_id, agent_id=agent, agent_version="1", runtime="python3", argv=["x"], limits={"memory_mb": 1},
        pid=1, started_at="2025-01-01T00:00:00.000Z", ended_at="2025-01-01T00:00:00.001Z", exit_code=0, signal=None,
        outcome=outcome, error=None, duration_ms=1, cpu_ms=1, peak_rss_kib=1, stdout_bytes=1, scratch_peak_bytes=0,
        stderr_tail="line \"quoted\" é\n", result={"intent_id": intent_id, "status": "ok", "text": "t", "sources": []},
        network_enforced=False,
    )


def test_append_recent_get(tmp_path: Path) -> None:
    store = DispatchStore(tmp_path / "d")
    for i in range(5):
        store.append(record(f"id-{i}", agent="a@local" if i % 2 else "b@local"))
    assert [r.intent_id for r in store.recent(3)] == ["id-4", "id-3", "id-2"]
    assert [r.intent_id for r in store.recent(10, agent="a@local")] == ["id-3", "id-1"]
    assert store.get("id-2") == record("id-2", agent="b@local")
    assert store.get("missing") is None
    assert store.problems == []
    assert DispatchStore(tmp_path / "nothing").recent(5) == []


def test_segments_rotate_by_size(tmp_path: Path) -> None:
    store = DispatchStore(tmp_path, segment_bytes=2000)
    for i in range(20):
        store.append(record(f"id-{i}"))
    assert len(store.segments()) > 3
    assert [r.intent_id for r in store.recent(20)] == [f"id-{i}" for i in reversed(range(20))]
    assert store.get("id-0") is not None and store.get("id-19") is not None


def test_torn_last_line_is_reported_and_survived(tmp_path: Path) -> None:
    store = DispatchStore(tmp_path)
    store.append(record("id-1"))
    store.close()
    segment = store.segments()[-1]
    with open(segment, "ab") as f:
        f.write(b'{"intent_id":"id-torn","agent')  # a crash mid-write
    reader = DispatchStore(tmp_path)
    assert [r.intent_id for r in reader.recent(5)] == ["id-1"]
    assert len(reader.problems) == 1 and str(segment) in reader.problems[0]
    writer = DispatchStore(tmp_path)
    writer.append(record("id-2"))
    assert [r.intent_id for r in writer.recent(5)] == ["id-2", "id-1"]
    assert writer.get("id-2") is not None


def test_long_history_reads_backwards_in_blocks(tmp_path: Path) -> None:
    store = DispatchStore(tmp_path)
    for i in range(400):  # several 64 KiB blocks
        store.append(record(f"id-{i:04d}"))
    assert [r.intent_id for r in store.recent(400)] == [f"id-{i:04d}" for i in reversed(range(400))]
