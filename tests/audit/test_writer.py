"""The writer: acknowledgements, fail-closed on sync errors, segments, recovery rules."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.errors import AuditDataError, AuditLogError, AuditUnavailable
from covenant.audit.events import text_digest
from covenant.audit.format import parse_record
from covenant.audit.reader import Entry, iter_records
from covenant.audit.verify import verify_log
from covenant.audit.writer import AuditLog
from covenant.config import AuditConfig

from .conftest import read_lines, segment, write_events, write_lines


async def test_record_returns_seq_after_checkpoint_and_head_matches(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    batches: list[tuple[int, float]] = []
    async with AuditLog.open(tmp_path / "a", key, AuditConfig(), on_batch=lambda n, s: batches.append((n, s))) as log:
        assert log.healthy and log.failure is None
        seq = await log.record("daemon.start", {"pid": 1})
        assert seq == 2  # 0 genesis, 1 its checkpoint
        # The record is on disk and its checkpoint follows it before record() returned.
        lines = read_lines(segment(tmp_path / "a"))
        assert parse_record(lines[2])[0]["type"] == "daemon.start"
        assert parse_record(lines[3])[0]["type"] == "audit.checkpoint"
        assert log.head is not None and log.head["seq"] == 2
        assert log.public_key_hex == log.head["pubkey"]
    assert batches[0][0] == 1 and batches[0][1] >= 0
    head = json.loads((tmp_path / "a" / "head.json").read_text())
    assert head["seq"] == 2 and head["checkpoint_seq"] == 3


async def test_concurrent_records_share_checkpoints(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    sizes: list[int] = []
    seqs: list[int] = []
    async with AuditLog.open(tmp_path, key, AuditConfig(), on_batch=lambda n, s: sizes.append(n)) as log:

        async def one(n: int) -> None:
            seqs.append(await log.record("intent.received", {"n": n}))

        async with trio.open_nursery() as nursery:
            for n in range(200):
                nursery.start_soon(one, n)
    assert len(set(seqs)) == 200
    assert max(sizes) > 1  # group commit happened
    report = verify_log(tmp_path, key.public_key())
    assert report.ok and report.records == 2 + 200 + len(sizes)


async def test_bad_data_is_recorded_as_audit_error_and_refused(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    """Each bad event fails its call with the reason, and leaves an audit.error in its place (never a gap)."""
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        with pytest.raises(AuditDataError, match="float"):
            await log.record("agent.exited", {"cpu_s": 0.5})
        with pytest.raises(AuditDataError, match="float"):
            await log.record("agent.exited", {"nested": [{"x": float("nan")}]})
        with pytest.raises(AuditDataError, match="reserved"):
            await log.record("audit.checkpoint", {})
        with pytest.raises(AuditDataError, match="dotted"):
            await log.record("Bad Type", {})
        with pytest.raises(AuditDataError, match="cannot be encoded"):
            await log.record("intent.received", {"text": "\ud800"})
        assert log.healthy
        await log.record("intent.received", text_digest("\ud800 hello", store_text=True))
    assert verify_log(tmp_path, key.public_key()).ok
    types = [parse_record(line)[0]["type"] for line in read_lines(segment(tmp_path))]
    assert types.count("audit.error") == 5


def test_text_digest() -> None:
    d = text_digest("héllo", store_text=False)
    assert d == {"bytes": 6, "sha256": hashlib.sha256("héllo".encode()).hexdigest()}
    assert text_digest("héllo", store_text=True)["text"] == "héllo"


class FailingSync:
    """A writer process whose fdatasync raises EIO while armed (tests/audit/failing_writer.py)."""

    def __init__(self, tmp_path: Path) -> None:
        self._flag = tmp_path / "fail-fsync"
        self.command = [sys.executable, str(Path(__file__).with_name("failing_writer.py")), str(self._flag)]

    @property
    def armed(self) -> bool:
        return self._flag.exists()

    @armed.setter
    def armed(self, value: bool) -> None:
        if value:
            self._flag.touch()
        else:
            self._flag.unlink()


async def test_fsync_eio_fails_closed(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    sync = FailingSync(tmp_path)
    directory = tmp_path / "log"
    acked: list[int] = []
    errors: list[str] = []
    async with AuditLog.open(directory, key, AuditConfig(), writer=sync.command) as log:
        acked.append(await log.record("daemon.start", {"pid": 1}))
        sync.armed = True

        async def one(n: int) -> None:
            try:
                acked.append(await log.record("intent.received", {"n": n}))
            except AuditUnavailable as exc:
                errors.append(exc.code)

        async with trio.open_nursery() as nursery:
            for n in range(10):
                nursery.start_soon(one, n)
        assert acked == [2]  # nothing of the failed batch (nor anything queued behind it) was acknowledged
        assert errors == ["audit_unavailable"] * 10
        assert not log.healthy and log.failure is not None and "Input/output error" in log.failure
        # Refused at once while the log is down, even when the disk is already good again.
        sync.armed = False
        with pytest.raises(AuditUnavailable) as info:
            await log.record("intent.received", {"n": 99})
        assert info.value.exit_code == 5 and info.value.http_status == 503
        # It reopens the log from disk by itself, and says so in the log.
        with trio.fail_after(30):
            while not log.healthy:
                await trio.sleep(0.05)
        resumed_at = await log.record("intent.received", {"n": 100})
    records = [parse_record(line)[0] for line in read_lines(segment(directory))]
    resume = [r for r in records if r["type"] == "audit.resume"]
    assert len(resume) == 1 and resume[0]["seq"] < resumed_at
    assert resume[0]["data"]["refused"] == 11 and "Input/output error" in resume[0]["data"]["error"]
    assert resume[0]["data"]["down_ms"] >= 0
    assert verify_log(directory, key.public_key()).ok
    # Reopening starts over on a good disk; the log verifies.
    async with AuditLog.open(directory, key, AuditConfig()) as log:
        assert log.healthy
        await log.record("daemon.start", {"pid": 2})
    assert verify_log(directory, key.public_key()).ok


async def test_eio_on_roll_over_fails_closed(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    sync = FailingSync(tmp_path)
    async with AuditLog.open(tmp_path / "log", key, AuditConfig(segment_bytes=4096), writer=sync.command) as log:
        while not (tmp_path / "log" / "audit-000001.jsonl").exists():
            await log.record("intent.received", {"pad": "x" * 200})
        sync.armed = True
        with pytest.raises(AuditUnavailable):
            for _ in range(40):  # the next roll-over hits the failing sync
                await log.record("intent.received", {"pad": "x" * 200})


async def test_segments_roll_over_and_a_missing_one_is_detected(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    await write_events(tmp_path, key, sequential=60, segment_bytes=4096)
    names = sorted(p.name for p in tmp_path.glob("audit-*.jsonl"))
    assert len(names) >= 4
    report = verify_log(tmp_path, key.public_key())
    assert report.ok and report.segments == len(names)
    entries = [x for x in iter_records(tmp_path) if isinstance(x, Entry)]
    assert [e.seq for e in entries] == list(range(report.records))
    first = parse_record(read_lines(tmp_path / names[2])[0])[0]
    assert first["type"] == "audit.segment" and first["data"]["segment"] == 2
    (tmp_path / names[2]).rename(tmp_path / "aside")
    report = verify_log(tmp_path, key.public_key())
    assert not report.ok
    assert report.first_problem.segment == names[2]
    assert report.first_problem.seq == first["seq"]
    assert "missing" in report.first_problem.message
    with pytest.raises(AuditLogError, match="missing"):
        async with AuditLog.open(tmp_path, key, AuditConfig()):
            pass


async def test_recovery_refuses_to_discard_signed_history(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    await write_events(tmp_path, key, sequential=5)
    path = segment(tmp_path)
    lines = read_lines(path)
    lines[4] = lines[4].replace(b'"outcome":"ok"', b'"outcome":"no"')  # damage well before the tail
    write_lines(path, lines)
    with pytest.raises(AuditLogError, match="not a torn write"):
        async with AuditLog.open(tmp_path, key, AuditConfig()):
            pass
    assert read_lines(path) == lines  # nothing was appended or cut


async def test_second_writer_is_refused_and_verify_sees_live_log(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        await log.record("daemon.start", {"pid": 1})
        with pytest.raises(AuditLogError, match="another process"):
            async with AuditLog.open(tmp_path, key, AuditConfig()):
                pass
        # A half-written batch on a live log is a warning, not a failure.
        with open(segment(tmp_path), "ab") as f:
            f.write(b'{"data":{},"prev"')
        report = await trio.to_thread.run_sync(verify_log, tmp_path, key.public_key())
        assert report.ok and report.live and any("live" in w for w in report.warnings)
        # (the writer recovers this on its next open; close it without writing more)
    report = verify_log(tmp_path, key.public_key())
    assert not report.ok  # stopped with a torn tail: not valid until recovered
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        assert log.recovered is not None and log.recovered["discarded_bytes"] == len(b'{"data":{},"prev"') + 1
    assert verify_log(tmp_path, key.public_key()).ok


async def test_wrong_key_is_refused(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    await write_events(tmp_path, key, sequential=1)
    with pytest.raises(AuditLogError, match="started by public key"):
        async with AuditLog.open(tmp_path, Ed25519PrivateKey.generate(), AuditConfig()):
            pass


async def test_heartbeat_checkpoint_when_idle(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    async with AuditLog.open(tmp_path, key, AuditConfig(heartbeat_s=1)) as log:
        await log.record("daemon.start", {"pid": 1})
        head = log.head
        assert head is not None
        with trio.fail_after(15):  # real time: the heartbeat is due after 1 s idle
            while log.head is None or log.head["seq"] == head["seq"]:
                await trio.sleep(0.05)
    types = [parse_record(x)[0]["type"] for x in read_lines(segment(tmp_path))]
    assert "audit.heartbeat" in types
    assert verify_log(tmp_path, key.public_key()).ok


async def test_bytes_appended_under_a_live_writer_are_sealed_out_of_the_chain(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    foreign = b'{"data":{"forged":true},"prev":"00","seq":4,"ts":"x","type":"grant.added","v":1}\n'
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        await log.record("daemon.start", {"pid": 1})
        with open(segment(tmp_path), "ab") as f:  # someone else writes to the open segment
            f.write(foreign)
        after = await log.record("intent.received", {"n": 1})
        assert log.healthy
    assert segment(tmp_path).read_bytes().endswith(foreign)  # the evidence stays where it was written
    first = parse_record(read_lines(segment(tmp_path, 1))[0])[0]
    assert first["type"] == "audit.segment"
    assert first["data"]["sealed_bytes"] == len(foreign)
    assert first["data"]["sealed_sha256"] == hashlib.sha256(foreign).hexdigest()
    assert first["data"]["previous_bytes"] == segment(tmp_path).stat().st_size - len(foreign)
    report = verify_log(tmp_path, key.public_key())
    assert report.ok and report.records > after
    assert any("not part of the log" in w and str(len(foreign)) in w for w in report.warnings), report.warnings
    # The daemon restarts on it and carries on.
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        await log.record("daemon.start", {"pid": 2})
    assert verify_log(tmp_path, key.public_key()).ok
    # The sealed bytes are pinned by the signed record: changing them afterwards is caught.
    path = segment(tmp_path)
    path.write_bytes(path.read_bytes()[:-3] + b"}}\n")
    report = verify_log(tmp_path, key.public_key())
    assert not report.ok and report.first_problem is not None and report.first_problem.segment == path.name


async def test_a_cut_tail_is_reported_by_verify(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    await write_events(tmp_path, key, sequential=2)
    with open(segment(tmp_path), "ab") as f:
        f.write(b'{"hello":"foreign"}\n')
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        assert log.recovered is not None
    report = verify_log(tmp_path, key.public_key())
    assert report.ok and any("audit.recover" in w for w in report.warnings), report.warnings
