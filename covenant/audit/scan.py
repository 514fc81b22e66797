"""The chain walker: the one place that decides whether a line belongs to the log.

Both ``verify`` and the writer's crash recovery run it, so the writer never
accepts on open what verify would reject. It walks lines of one segment at a
time, keeps the hash chain and the last *committed* point (the end of the
last checkpoint line), and accepts discarded bytes only where an
``audit.recover`` record names exactly them.

Its records are NamedTuples and plain classes, not dataclasses: the audit writer process imports
this module, and ``dataclasses`` would bring inspect, ast and dis into it (≈ 1.1 MB, issue 38).
"""

from __future__ import annotations

import hashlib
import re
from binascii import hexlify
from collections.abc import Iterable
from typing import Any, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from covenant.audit.format import (
    CHECKPOINT,
    FORMAT,
    GENESIS,
    CHECKPOINT_DATA_RE,
    AUDIT_ERROR,
    HEARTBEAT,
    HEX64_RE,
    LINE_RE,
    RECOVER,
    RESUME,
    SEGMENT,
    WRITER_TYPES,
    ZERO_HASH,
    canonical_object,
    checkpoint_signature_ok,
    line_hash,
    parse_record,
    segment_name,
)
from covenant.keys import public_key_hex

__all__ = ["Problem", "Committed", "SegmentResult", "Run", "scan_runs", "Walker"]

_LOG_ID_RE = re.compile(r"[0-9a-f]{32}")


class Problem(NamedTuple):
    """The first thing wrong with a log: where it is and what it is."""

    segment: str
    seq: int | None
    offset: int
    message: str

    def __str__(self) -> str:
        seq = "-" if self.seq is None else str(self.seq)
        return f"{self.segment}: seq {seq}, byte offset {self.offset}: {self.message}"


class Committed(NamedTuple):
    """The chain state right after the last checkpoint line."""

    next_seq: int
    prev: str
    records: int
    segment: str | None
    end: int  # byte offset just past the checkpoint line in ``segment``
    checkpoint: dict[str, Any] | None  # the checkpoint record itself


class SegmentResult:
    """What walking one segment found."""

    __slots__ = ("problem", "recoveries", "torn")

    def __init__(self) -> None:
        self.problem: Problem | None = None
        self.torn = False  # the problem is an unterminated last line (a write in progress or cut short)
        self.recoveries = 0


class _Last(NamedTuple):
    seq: int
    segment: str
    offset: int
    ts: str
    type: str


class Run(NamedTuple):
    """Consecutive lines that ``scan_runs`` proved valid among themselves.

    Valid among themselves means: each line is in the writer's canonical
    layout, is an ordinary event, a checkpoint or a heartbeat, is not the
    first line of a segment nor seq 0, chains to the line before it in the run
    (seq + 1, prev = its hash), and each checkpoint covers the line before it,
    names the log ``log_id``, carries that line's ts and its signature
    verifies. What depends on the lines before the run (the first line's seq,
    prev and, for a checkpoint, ts) is left to ``Walker._apply_run``.
    """

    start: int  # offset of the first line in the segment
    end: int  # offset just past the last line's newline
    log_id: str | None  # the log id checkpoints were checked against
    first_seq: int
    first_prev: str
    first_checkpoint_ts: str | None  # ts of the first line when it is a checkpoint
    lines: int
    last_seq: int
    last_hash: str
    last_offset: int
    last_ts: str
    last_type: str
    checkpoint_lines: int  # lines up to and including the last checkpoint; 0 when none
    checkpoint_start: int
    checkpoint_end: int
    checkpoint_hash: str
    witnesses: tuple[tuple[int, str, int], ...]  # (seq, line hash, 1-based line number in the run)


_CHECKPOINT_B = CHECKPOINT.encode()
_HEARTBEAT_B = HEARTBEAT.encode()


def scan_runs(
    data: bytes,
    start: int,
    stop: int,
    log_id: str | None,
    public_key: Ed25519PublicKey | None,
    witness_seqs: frozenset[int] = frozenset(),
) -> list[Run]:
    """The runs among the lines of ``data[start:stop]`` (``start`` at a line start).

    This is the expensive, independent part of walking (canonical form,
    hashes, signatures), so verify runs it on chunks in parallel. A line that
    cannot be proven here (any audit record but checkpoints and heartbeats,
    the first line of a segment, seq 0, a line in another layout, anything
    invalid, a torn last line) ends the run before it and is left to the
    walker, which decides about it exactly as it decides about any line.
    ``public_key`` None skips signatures, as in ``Walker``.
    """
    runs: list[Run] = []
    fullmatch = LINE_RE.fullmatch
    checkpoint_match = CHECKPOINT_DATA_RE.fullmatch
    find = data.find
    sha256 = hashlib.sha256
    log_b = log_id.encode("ascii") if log_id is not None else None
    count = 0  # lines in the open run; 0 when none is open
    run_start = first_seq = cp_lines = cp_start = cp_end = last_seq = last_offset = last_end = 0
    first_prev = last_hash = cp_hash = last_ts = last_type = b""
    first_cp_ts: bytes | None = None
    witnesses: list[tuple[int, str, int]] = []

    def close() -> None:
        runs.append(
            Run(
                run_start,
                last_end,
                log_id,
                first_seq,
                first_prev.decode("ascii"),
                None if first_cp_ts is None else first_cp_ts.decode("ascii"),
                count,
                last_seq,
                last_hash.decode("ascii"),
                last_offset,
                last_ts.decode("ascii"),
                last_type.decode("ascii"),
                cp_lines,
                cp_start,
                cp_end,
                cp_hash.decode("ascii"),
                tuple(witnesses),
            )
        )

    pos = start
    while pos < stop:
        nl = find(b"\n", pos, stop)
        if nl < 0:
            break  # an unterminated last line
        m = fullmatch(data, pos, nl) if pos else None
        good = False
        if m is not None:
            raw, prev_b, seq_b, ts_b, type_b = m.groups()
            seq = int(seq_b)
            if count and (seq != last_seq + 1 or prev_b != last_hash):
                good = False
            elif seq == 0:
                good = False
            elif type_b == _CHECKPOINT_B:
                cm = checkpoint_match(raw)
                good = (
                    cm is not None
                    and log_b is not None
                    and cm.group(2) == log_b
                    and cm.group(1) == prev_b
                    and int(cm.group(3)) == seq - 1
                    and (not count or ts_b == last_ts)
                    and (
                        public_key is None
                        or checkpoint_signature_ok(
                            public_key, log_id, seq - 1, prev_b.decode("ascii"), cm.group(4).decode("ascii")
                        )
                    )
                )
            elif type_b.startswith(b"audit."):
                good = type_b == _HEARTBEAT_B and raw == b"{}"
            else:
                good = canonical_object(raw) is not None
        if not good:
            if count:
                close()
                count = 0
            pos = nl + 1
            continue
        h = hexlify(sha256(data[pos:nl]).digest())
        if not count:
            run_start, first_seq, first_prev, cp_lines = pos, seq, prev_b, 0
            first_cp_ts = ts_b if type_b == _CHECKPOINT_B else None
            witnesses = []
        count += 1
        if type_b == _CHECKPOINT_B:
            cp_lines, cp_start, cp_end, cp_hash = count, pos, nl + 1, h
        if seq in witness_seqs:
            witnesses.append((seq, h.decode("ascii"), count))
        last_seq, last_hash, last_ts, last_type, last_offset = seq, h, ts_b, type_b, pos
        pos = last_end = nl + 1
    if count:
        close()
    return runs


class Walker:
    """Walks segments in order. ``public_key`` None skips signature checks (recovery scans)."""

    def __init__(self, public_key: Ed25519PublicKey | None, expected_pubkey_hex: str | None = None) -> None:
        self.public_key = public_key
        if public_key is not None and expected_pubkey_hex is None:
            expected_pubkey_hex = public_key_hex(public_key)
        self.expected_pubkey_hex = expected_pubkey_hex
        self.next_seq = 0
        self.prev = ZERO_HASH
        self.log_id: str | None = None
        self.records = 0
        self.last: _Last | None = None
        self.committed = Committed(0, ZERO_HASH, 0, None, 0, None)
        self.witness_seqs: frozenset[int] = frozenset()  # seqs whose committed line hashes to collect
        self.witness_seen: dict[int, str] = {}
        self._witness_pending: dict[int, str] = {}

    # -- state -----------------------------------------------------------------

    def start_mid_log(self, next_seq: int, prev: str, log_id: str) -> None:
        """Begin at a later segment (recovery scans only the last one)."""
        self.next_seq, self.prev, self.log_id = next_seq, prev, log_id
        self.committed = Committed(next_seq, prev, 0, None, 0, None)

    @property
    def pending(self) -> int:
        """Records accepted after the last checkpoint (not yet proven)."""
        return self.records - self.committed.records

    def seal(self) -> None:
        """Forget what was read after the last checkpoint: the writer sealed those bytes out of the chain."""
        self._rollback()

    def _rollback(self) -> None:
        c = self.committed
        self.next_seq, self.prev, self.records = c.next_seq, c.prev, c.records
        self._witness_pending.clear()

    # -- walking ---------------------------------------------------------------

    def walk_segment(
        self, index: int, data: bytes, previous_size: int | None, runs: Iterable[Run] = ()
    ) -> SegmentResult:
        """Walk one segment's bytes. ``previous_size``: size of segment index-1 (None for index 0).

        ``runs``: what ``scan_runs`` found in ``data``, in order (with this
        walker's public key and log id). A run that starts where the walk
        stands and continues its chain is taken whole; every other line is
        checked here one by one, so the outcome and the first problem are the
        same with or without runs.
        """
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
        upcoming = iter(runs)
        run = next(upcoming, None)
        while pos < size:
            while run is not None and run.start < pos:
                run = next(upcoming, None)
            if run is not None and run.start == pos and self._apply_run(run, name, data):
                pos = run.end
                run = next(upcoming, None)
                continue
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

    def _apply_run(self, run: Run, name: str, data: bytes) -> bool:
        """Accept ``run`` when it continues the chain: the same state changes as accepting its lines one by one."""
        if run.first_seq != self.next_seq or run.first_prev != self.prev:
            return False
        if run.first_checkpoint_ts is not None and (self.last is None or self.last.ts != run.first_checkpoint_ts):
            return False
        if run.checkpoint_lines and (run.log_id is None or run.log_id != self.log_id):
            return False
        records_before = self.records
        self.records += run.lines
        self.next_seq = run.last_seq + 1
        self.prev = run.last_hash
        self.last = _Last(run.last_seq, name, run.last_offset, run.last_ts, run.last_type)
        if run.checkpoint_lines:
            checkpoint, _ = parse_record(data[run.checkpoint_start : run.checkpoint_end - 1])
            self.committed = Committed(
                run.first_seq + run.checkpoint_lines,
                run.checkpoint_hash,
                records_before + run.checkpoint_lines,
                name,
                run.checkpoint_end,
                checkpoint,
            )
            self.witness_seen.update(self._witness_pending)
            self._witness_pending.clear()
        for seq, h, line_number in run.witnesses:
            if line_number <= run.checkpoint_lines:
                self.witness_seen[seq] = h
            else:
                self._witness_pending[seq] = h
        return True

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
            if "sealed_bytes" in d:  # checked against the bytes by verify_log before this segment is walked
                expected["sealed_bytes"], expected["sealed_sha256"] = d["sealed_bytes"], d.get("sealed_sha256")
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
        if type_ == RESUME:
            if set(d) != {"error", "down_ms", "refused"}:
                return "audit.resume data must hold error, down_ms, refused"
            return None
        if type_ == AUDIT_ERROR:
            if set(d) != {"event_type", "intent", "error"}:
                return "audit.error data must hold event_type, intent, error"
            return None
        if type_ in WRITER_TYPES or type_.startswith("audit."):
            return f"unknown audit record type {type_}"
        return None
