"""The chain walker: the one place that decides whether a line belongs to the log.

Both ``verify`` and the writer's crash recovery run it, so the writer never
accepts on open what verify would reject. It walks lines of one segment at a
time, keeps the hash chain and the last *committed* point (the end of the
last checkpoint line), and accepts discarded bytes only where an
``audit.recover`` record names exactly them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from covenant.audit.format import (
    CHECKPOINT,
    FORMAT,
    GENESIS,
    HEARTBEAT,
    HEX64_RE,
    RECOVER,
    SEGMENT,
    WRITER_TYPES,
    ZERO_HASH,
    checkpoint_signature_ok,
    line_hash,
    parse_record,
    segment_name,
)
from covenant.keys import public_key_hex

__all__ = ["Problem", "Committed", "SegmentResult", "Walker"]

_LOG_ID_RE = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Problem:
    """The first thing wrong with a log: where it is and what it is."""

    segment: str
    seq: int | None
    offset: int
    message: str

    def __str__(self) -> str:
        seq = "-" if self.seq is None else str(self.seq)
        return f"{self.segment}: seq {seq}, byte offset {self.offset}: {self.message}"


@dataclass(frozen=True)
class Committed:
    """The chain state right after the last checkpoint line."""

    next_seq: int
    prev: str
    records: int
    segment: str | None
    end: int  # byte offset just past the checkpoint line in ``segment``
    checkpoint: dict[str, Any] | None  # the checkpoint record itself


@dataclass
class SegmentResult:
    """What walking one segment found."""

    problem: Problem | None = None
    torn: bool = False  # the problem is an unterminated last line (a write in progress or cut short)
    recoveries: int = 0


@dataclass(slots=True)
class _Last:
    seq: int
    segment: str
    offset: int
    ts: str
    type: str


@dataclass
class Walker:
    """Walks segments in order. ``public_key`` None skips signature checks (recovery scans)."""

    public_key: Ed25519PublicKey | None
    expected_pubkey_hex: str | None = None
    next_seq: int = 0
    prev: str = ZERO_HASH
    log_id: str | None = None
    records: int = 0
    last: _Last | None = None
    committed: Committed = field(default_factory=lambda: Committed(0, ZERO_HASH, 0, None, 0, None))
    witness_seqs: frozenset[int] = frozenset()  # seqs whose committed line hashes to collect
    witness_seen: dict[int, str] = field(default_factory=dict)
    _witness_pending: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.public_key is not None and self.expected_pubkey_hex is None:
            self.expected_pubkey_hex = public_key_hex(self.public_key)

    # -- state -----------------------------------------------------------------

    def start_mid_log(self, next_seq: int, prev: str, log_id: str) -> None:
        """Begin at a later segment (recovery scans only the last one)."""
        self.next_seq, self.prev, self.log_id = next_seq, prev, log_id
        self.committed = Committed(next_seq, prev, 0, None, 0, None)

    @property
    def pending(self) -> int:
        """Records accepted after the last checkpoint (not yet proven)."""
        return self.records - self.committed.records

    def _rollback(self) -> None:
        c = self.committed
        self.next_seq, self.prev, self.records = c.next_seq, c.prev, c.records
        self._witness_pending.clear()

    # -- walking ---------------------------------------------------------------

    def walk_segment(self, index: int, data: bytes, previous_size: int | None) -> SegmentResult:
        """Walk one segment's bytes. ``previous_size``: size of segment index-1 (None for index 0)."""
        name = segment_name(index)
        result = SegmentResult()
        # Recover records name offsets inside their own segment: a new segment
        # starts with its committed end at byte 0.
        self.committed = Committed(
            self.committed.next_seq, self.committed.prev, self.committed.records, name, 0, self.committed.checkpoint
        )
        pos = 0
        last_recover_at = -1
        size = len(data)
        while pos < size:
            nl = data.find(b"\n", pos)
            if nl < 0:
                problem = Problem(
                    name, self.next_seq, pos, f"unterminated last line ({size - pos} bytes): a torn write"
                )
                found = self._find_recover(name, data, pos, last_recover_at)
                if found is None:
                    result.problem, result.torn = problem, True
                    return result
                self._rollback()
                pos = last_recover_at = found
                result.recoveries += 1
                continue
            line = data[pos:nl]
            problem = self._accept(name, index, data, pos, nl, line, previous_size)
            if problem is not None:
                found = self._find_recover(name, data, pos, last_recover_at)
                if found is None:
                    result.problem = problem
                    return result
                self._rollback()
                pos = last_recover_at = found
                result.recoveries += 1
                continue
            pos = nl + 1
        return result

    def _find_recover(self, name: str, data: bytes, start: int, after: int) -> int | None:
        """Offset of an audit.recover line that names the bytes from the committed end to itself."""
        c = self.committed
        valid = c.end
        p = start
        while True:
            nl = data.find(b"\n", p)
            if nl < 0:
                return None
            line = data[p:nl]
            if p > after and b'"type":"audit.recover"' in line:
                rec, _ = parse_record(line)
                if (
                    rec is not None
                    and rec["type"] == RECOVER
                    and rec["seq"] == c.next_seq
                    and rec["prev"] == c.prev
                    and self._recover_problem(rec["data"], name, data, valid, p) is None
                ):
                    return p
            p = nl + 1

    def _recover_problem(self, d: dict[str, Any], name: str, data: bytes, valid: int, at: int) -> str | None:
        if set(d) != {"discarded_bytes", "discarded_sha256", "segment", "valid_bytes"}:
            return "audit.recover data must hold discarded_bytes, discarded_sha256, segment, valid_bytes"
        if d["segment"] != name:
            return f"audit.recover names segment {d['segment']!r}, not {name}"
        if d["valid_bytes"] != valid:
            return f"audit.recover says the valid log ends at byte {d['valid_bytes']}, but the last checkpoint ends at {valid}"
        if d["discarded_bytes"] != at - valid or at - valid <= 0:
            return f"audit.recover says {d['discarded_bytes']} bytes were discarded, but {at - valid} precede it"
        if d["discarded_sha256"] != hashlib.sha256(data[valid:at]).hexdigest():
            return "audit.recover: sha256 of the discarded bytes does not match"
        return None

    def _accept(
        self, name: str, index: int, data: bytes, pos: int, nl: int, line: bytes, previous_size: int | None
    ) -> Problem | None:
        seq = self.next_seq
        rec, why = parse_record(line)
        if rec is None:
            return Problem(name, seq, pos, why)
        if rec["seq"] != seq:
            hint = "a record is missing" if rec["seq"] > seq else "a record is repeated or out of order"
            return Problem(name, seq, pos, f"expected seq {seq}, found seq {rec['seq']} ({hint})")
        h = line_hash(line)
        type_ = rec["type"]
        d = rec["data"]
        if rec["prev"] != self.prev:
            return self._broken_link(name, data, pos, nl, rec, h)
        # Fast path: an ordinary event in the middle of a segment has no type rules.
        if seq == 0 or pos == 0 or type_.startswith("audit."):
            message = self._type_problem(rec, d, type_, name, index, data, pos, previous_size)
            if message is not None:
                return Problem(name, seq, pos, message)
        # accepted
        self.next_seq = seq + 1
        self.prev = h
        self.records += 1
        self.last = _Last(seq, name, pos, rec["ts"], type_)
        if seq in self.witness_seqs:
            self._witness_pending[seq] = h
        if type_ == CHECKPOINT:
            self.committed = Committed(self.next_seq, h, self.records, name, nl + 1, rec)
            if self._witness_pending:
                self.witness_seen.update(self._witness_pending)
                self._witness_pending.clear()
        return None

    def _broken_link(self, name: str, data: bytes, pos: int, nl: int, rec: dict[str, Any], h: str) -> Problem:
        """Say which of the two lines around a broken link was changed, where the log can tell."""
        seq = rec["seq"]
        intact = False  # evidence that *this* line is as written: then the line before was changed
        if rec["type"] == CHECKPOINT and self.public_key is not None and self.log_id is not None:
            intact = checkpoint_signature_ok(self.public_key, self.log_id, seq - 1, rec["prev"], rec["data"].get("sig"))
        if not intact:
            nl2 = data.find(b"\n", nl + 1)
            if nl2 > 0:
                after, _ = parse_record(data[nl + 1 : nl2])
                intact = after is not None and after["prev"] == h
        if intact and self.last is not None:
            return Problem(
                self.last.segment,
                self.last.seq,
                self.last.offset,
                f"the line of seq {self.last.seq} does not hash to the prev that seq {seq} records: seq {self.last.seq} was changed",
            )
        return Problem(name, seq, pos, f"prev of seq {seq} is not the sha256 of the line before it: seq {seq} was changed")

    def _type_problem(
        self,
        rec: dict[str, Any],
        d: dict[str, Any],
        type_: str,
        name: str,
        index: int,
        data: bytes,
        pos: int,
        previous_size: int | None,
    ) -> str | None:
        seq = rec["seq"]
        if seq == 0 or type_ == GENESIS:
            if seq != 0 or type_ != GENESIS:
                return "the log must begin with audit.genesis at seq 0, and only there"
            if set(d) != {"format", "log", "pubkey"} or d["format"] != FORMAT:
                return f"audit.genesis data must be format={FORMAT}, log, pubkey"
            if not isinstance(d["log"], str) or not _LOG_ID_RE.fullmatch(d["log"]):
                return "audit.genesis log id must be 32 lowercase hex characters"
            if not isinstance(d["pubkey"], str) or not HEX64_RE.fullmatch(d["pubkey"]):
                return "audit.genesis pubkey must be 64 lowercase hex characters"
            if self.expected_pubkey_hex is not None and d["pubkey"] != self.expected_pubkey_hex:
                return (
                    f"this log was started by public key {d['pubkey']}, not the pinned key "
                    f"{self.expected_pubkey_hex} (pass the right key with --pubkey or audit.pubkey)"
                )
            self.log_id = d["log"]
            return None
        first_of_segment = pos == 0
        if first_of_segment and index > 0 and type_ != SEGMENT:
            return f"{name} must begin with an audit.segment record"
        if type_ == SEGMENT:
            if not first_of_segment or index == 0:
                return "audit.segment may only be the first record of a segment after the first"
            expected = {
                "segment": index,
                "previous": segment_name(index - 1),
                "previous_bytes": previous_size,
                "previous_last_hash": rec["prev"],
                "previous_last_seq": seq - 1,
            }
            if d != expected:
                diff = ", ".join(f"{k}={d.get(k)!r} (expected {v!r})" for k, v in expected.items() if d.get(k) != v)
                return f"audit.segment does not match the segment before it: {diff or 'unexpected fields'}"
            return None
        if type_ == CHECKPOINT:
            if set(d) != {"hash", "log", "seq", "sig"}:
                return "audit.checkpoint data must hold hash, log, seq, sig"
            if d["seq"] != seq - 1 or d["hash"] != rec["prev"]:
                return f"checkpoint must cover the record just before it (seq {seq - 1}, hash {rec['prev']})"
            if d["log"] != self.log_id:
                return f"checkpoint is for log {d['log']!r}, this log is {self.log_id!r}"
            if self.last is None or rec["ts"] != self.last.ts:
                return "checkpoint ts must equal the ts of the record it covers"
            if self.public_key is not None and not checkpoint_signature_ok(
                self.public_key, self.log_id, d["seq"], d["hash"], d["sig"]
            ):
                return "checkpoint signature does not verify under the pinned public key"
            return None
        if type_ == RECOVER:
            return self._recover_problem(d, name, data, self.committed.end, pos)
        if type_ == HEARTBEAT:
            return None if d == {} else "audit.heartbeat data must be empty"
        if type_ in WRITER_TYPES or type_.startswith("audit."):
            return f"unknown audit record type {type_}"
        return None
