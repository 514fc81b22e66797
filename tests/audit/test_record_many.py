"""record_many: several events, in order, adjacent, durable and checkpointed on return."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.errors import AuditDataError
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


async def test_one_bad_event_refuses_the_whole_call(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        with pytest.raises(AuditDataError):
            await log.record_many([("intent.received", {"i": 1}), ("policy.decision", {"x": 1.5})])
        seq = await log.record("daemon.stop", {})
    # Nothing of the refused call was written: the next record follows genesis and its checkpoint.
    assert seq == 2
