"""recent_denials reads refused intents back from a real log, newest first, past damage (issue 16)."""

from __future__ import annotations

from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.denials import recent_denials
from covenant.audit.writer import AuditLog
from covenant.config import AuditConfig
from tests.audit.conftest import read_lines, segment, write_lines


def _write(directory: Path, key: Ed25519PrivateKey, count: int, **config: object) -> None:
    async def main() -> None:
        async with AuditLog.open(directory, key, AuditConfig(**config)) as log:
            for n in range(count):
                agent = "guarded@local" if n % 2 else "open@local"
                await log.record_many([
                    ("intent.received", {"intent": f"i{n}", "issuer": "ab" * 32, "issuer_display": f"user{n}@host"}),
                    ("policy.decision", {"intent": f"i{n}", "agent": agent, "allowed": n % 3 == 0,
                                         "reason": None if n % 3 == 0 else "capability_denied", "message": "m"}),
                ])
            await log.record("policy.decision", {"intent": "forged", "agent": None, "allowed": False,
                                                  "reason": "bad_signature", "message": "bad", "claimed_issuer": "cd" * 32})
    trio.run(main)


def test_newest_first_with_issuer_limit_and_agent(tmp_path: Path) -> None:
    _write(tmp_path, Ed25519PrivateKey.generate(), 9)
    found = recent_denials(tmp_path, 100)
    # denied: every n not divisible by 3, plus the forged intent refused before it was verified
    assert [d.intent_id for d in found] == ["forged", "i8", "i7", "i5", "i4", "i2", "i1"]
    assert found[0].issuer == "cd" * 32 and found[0].reason == "bad_signature" and found[0].agent_id is None
    assert found[1].issuer == "user8@host" and found[1].reason == "capability_denied"
    assert [d.intent_id for d in recent_denials(tmp_path, 2)] == ["forged", "i8"]
    assert [d.intent_id for d in recent_denials(tmp_path, 100, agent="guarded@local")] == ["i7", "i5", "i1"]
    assert found[1].to_json()["outcome"] == "denied"


def test_across_segments_and_past_a_damaged_line(tmp_path: Path) -> None:
    _write(tmp_path, Ed25519PrivateKey.generate(), 60, segment_bytes=4096)
    assert segment(tmp_path, 2).exists()
    lines = read_lines(segment(tmp_path, 0))
    damaged = [line.replace(b'"allowed":false', b'"allowed":fals') if b"i2" in line else line for line in lines]
    write_lines(segment(tmp_path, 0), damaged)
    found = [d.intent_id for d in recent_denials(tmp_path, 1000)]
    assert found[:3] == ["forged", "i59", "i58"] and "i2" not in found and "i1" in found
    assert len(found) == 1 + len([n for n in range(60) if n % 3]) - 1


def test_no_log_is_no_denials(tmp_path: Path) -> None:
    assert recent_denials(tmp_path / "absent", 10) == []
