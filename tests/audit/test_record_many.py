"""record_many: several events, in order, adjacent, durable and checkpointed on return."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.errors import AuditDataError, AuditEventReplaced
from covenant.audit.format import parse_record
from covenant.audit.verify import verify_log
from covenant.audit.writer import AuditLog
from covenant.config import AuditConfig

from .conftest import read_lines, segment


async def test_events_are_adjacent_in_order_and_share_one_checkpoint(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    batches: list[int] = []
    async with AuditLog.open(tmp_path, key, AuditConfig(), on_batch=lambda n, s: batches.append(n)) as log:

        async def noise(n: int) -> None:
            await log.record("daemon.start", {"n": n})

        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(noise, n)
            seqs = await log.record_many([("intent.received", {"i": 1}), ("policy.decision", {"i": 2})])
        assert seqs[1] == seqs[0] + 1
        lines = read_lines(segment(tmp_path))
        types = [parse_record(line)[0]["type"] for line in lines]
        assert types[seqs[0]] == "intent.received" and types[seqs[1]] == "policy.decision"
    assert verify_log(tmp_path, key.public_key()).ok


async def test_an_event_that_cannot_be_encoded_is_recorded_as_audit_error(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    """Never a silent gap: the bad event's place holds audit.error (its type, intent and why), the other
    events and the dispatch record are written, and then the call fails."""
    dispatches = tmp_path / "dispatches"
    async with AuditLog.open(tmp_path / "audit", key, AuditConfig(), dispatches=dispatches) as log:
        with pytest.raises(AuditEventReplaced, match="float") as raised:
            await log.record_many([("intent.received", {"intent": "i1"}),
                                   ("agent.exited", {"intent": "i1", "cpu": 1.5}),
                                   ("intent.completed", {"intent": "i1", "text": "a\ud800b"})],
                                  dispatch_record=b'{"intent_id":"i1"}\n')
        assert raised.value.replaced == ("agent.exited", "intent.completed")
        assert raised.value.code == "audit_error" and raised.value.http_status == 500
        assert isinstance(raised.value, AuditDataError)
        seq = await log.record("daemon.stop", {})
    records = [parse_record(line)[0] for line in read_lines(segment(tmp_path / "audit"))]
    events = [r for r in records if r["type"] != "audit.checkpoint"]
    assert [r["type"] for r in events] == ["audit.genesis", "intent.received", "audit.error", "audit.error",
                                           "daemon.stop"]
    assert events[2]["data"]["event_type"] == "agent.exited" and events[2]["data"]["intent"] == "i1"
    assert "float" in events[2]["data"]["error"]
    assert events[3]["data"]["event_type"] == "intent.completed" and "encoded" in events[3]["data"]["error"]
    assert seq == events[4]["seq"]
    assert (dispatches / next(p.name for p in dispatches.iterdir())).read_bytes() == b'{"intent_id":"i1"}\n'
    assert verify_log(tmp_path / "audit", key.public_key()).ok


async def test_an_error_event_of_a_hostile_intent_id_still_encodes(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        with pytest.raises(AuditEventReplaced):
            await log.record("intent.completed", {"intent": "x\udc80" * 1000, "n": float("nan")})
    error = next(parse_record(line)[0] for line in read_lines(segment(tmp_path))
                 if b'"audit.error"' in line)
    assert error["data"]["intent"] == ("x\ufffd" * 128)
    assert verify_log(tmp_path, key.public_key()).ok
