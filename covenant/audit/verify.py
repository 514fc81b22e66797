"""Verify an audit log against a pinned public key (pure reading, no trio).

What a passing verify proves: every record from seq 0 to the last checkpoint
is exactly as the daemon wrote it, in order, none missing or inserted, and
every byte the writer ever discarded after a crash is named by a signed
``audit.recover`` record. What it cannot prove without a witness: that the
log was not cut back to an earlier checkpoint (see docs/audit.md).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from covenant.audit.format import GENESIS, HEX64_RE, SEGMENT, checkpoint_signature_ok, parse_record, segment_name
from covenant.audit.scan import Problem, Run, Walker, scan_runs
from covenant.audit.store import HEAD_NAME, LOCK_NAME, list_segments, read_first_line
from covenant.errors import ConfigError
from covenant.home import Home
from covenant.keys import load_private_key, public_key_from_hex

__all__ = [
    "VerifyReport",
    "Problem",
    "verify_log",
    "pinned_public_key",
    "is_live",
    "load_witness",
    "CHUNK_BYTES",
    "PARALLEL_MIN_BYTES",
]

# Segments are scanned (canonical form, hashes, signatures) in chunks of about
# this size; from PARALLEL_MIN_BYTES on, by forked child processes, one per
# CPU, while this process walks the chain over their results.
CHUNK_BYTES = 1 << 20
PARALLEL_MIN_BYTES = 4 << 20


@dataclass
class VerifyReport:
    """The outcome of ``verify_log``."""

    ok: bool
    records: int
    first_problem: Problem | None = None
    warnings: list[str] = field(default_factory=list)
    segments: int = 0
    log_id: str | None = None
    last_checkpoint: dict[str, Any] | None = None  # {"seq", "hash", "ts", "segment"} of the last one
    live: bool = False

    def to_json(self) -> dict[str, Any]:
        problem = self.first_problem
        return {
            "ok": self.ok,
            "records": self.records,
            "segments": self.segments,
            "log": self.log_id,
            "live": self.live,
            "last_checkpoint": self.last_checkpoint,
            "warnings": self.warnings,
            "problem": None
            if problem is None
            else {"segment": problem.segment, "seq": problem.seq, "offset": problem.offset, "message": problem.message},
        }


def is_live(directory: Path) -> bool:
    """True when a writer holds the log's lock right now (so its tail may be mid-write)."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)  # also drops our shared lock
    return False


def load_witness(path: Path) -> dict[str, Any]:
    """Read a witness file (what ``covenant audit head`` printed). Raises ConfigError."""
    try:
        witness = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the witness file ({exc})", path=str(path)) from None
    if not isinstance(witness, dict) or not all(k in witness for k in ("log", "seq", "hash", "sig")):
        raise ConfigError(f"{path}: not a witness file (expected log, seq, hash, sig from `covenant audit head`)")
    return witness


def _witness_problem(witness: dict[str, Any], public_key: Ed25519PublicKey, log_id: str | None) -> str | None:
    seq, hash_hex = witness.get("seq"), witness.get("hash")
    if type(seq) is not int or not isinstance(hash_hex, str) or not HEX64_RE.fullmatch(hash_hex):
        return "witness: seq must be an integer and hash 64 lowercase hex characters"
    if witness.get("log") != log_id:
        return f"witness is for log {witness.get('log')!r}, this log is {log_id!r}"
    if not isinstance(witness.get("log"), str) or not checkpoint_signature_ok(
        public_key, witness["log"], seq, hash_hex, witness.get("sig")
    ):
        return "witness signature does not verify under the pinned public key"
    return None


def _chunks(data: bytes, chunk_bytes: int) -> list[tuple[int, int]]:
    """(start, stop) pairs of about ``chunk_bytes`` each, cut just after a newline."""
    size = len(data)
    bounds = [0]
    while True:
        nl = data.find(b"\n", bounds[-1] + chunk_bytes - 1)
        if nl < 0 or nl + 1 >= size:
            break
        bounds.append(nl + 1)
    bounds.append(size)
    return list(zip(bounds, bounds[1:]))


def _read_exact(f: BinaryIO, n: int) -> bytes | None:
    data = f.read(n)
    return data if len(data) == n else None


@contextmanager
def _forked_runs(
    chunks: list[tuple[int, int]], scan: Callable[[int, int], list[Run]], jobs: int
) -> Iterator[Iterator[Run]]:
    """Scan ``chunks`` in ``jobs`` forked children (chunk i in child i % jobs); yields the runs in order.

    Plain fork and one pipe per child: the children get the segment's bytes
    without copying or pickling, and send back small pickled runs. A child
    that dies only costs speed: its chunks are scanned here instead.
    """
    children: list[tuple[int, BinaryIO]] = []
    try:
        for worker in range(jobs):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child, which never returns
                status = 1
                try:
                    os.close(read_fd)
                    with open(write_fd, "wb") as out:
                        for start, stop in chunks[worker::jobs]:
                            blob = pickle.dumps(scan(start, stop), protocol=pickle.HIGHEST_PROTOCOL)
                            out.write(len(blob).to_bytes(8, "little") + blob)
                    status = 0
                finally:
                    os._exit(status)
            os.close(write_fd)
            children.append((pid, open(read_fd, "rb")))

        def in_order() -> Iterator[Run]:
            alive = [True] * jobs
            for i, (start, stop) in enumerate(chunks):
                worker = i % jobs
                if alive[worker]:
                    f = children[worker][1]
                    head = _read_exact(f, 8)
                    blob = None if head is None else _read_exact(f, int.from_bytes(head, "little"))
                    if blob is not None:
                        yield from pickle.loads(blob)
                        continue
                    alive[worker] = False
                yield from scan(start, stop)

        yield in_order()
    finally:
        for pid, f in children:
            f.close()
            try:
                os.kill(pid, signal.SIGKILL)  # a no-op for a child that already exited
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)


@contextmanager
def _segment_runs(
    data: bytes, walker: Walker, log_id: str | None, jobs: int, chunk_bytes: int
) -> Iterator[Iterator[Run]]:
    """The runs of one segment, in order: scanned in forked children when that pays."""
    chunks = _chunks(data, chunk_bytes)

    def scan(start: int, stop: int) -> list[Run]:
        return scan_runs(data, start, stop, log_id, walker.public_key, walker.witness_seqs)

    # Fork only from a single-threaded process (the CLI): a fork taken while
    # another thread holds a lock can leave the child stuck on it.
    if jobs > 1 and len(chunks) > 1 and threading.active_count() == 1:
        with _forked_runs(chunks, scan, min(jobs, len(chunks))) as runs:
            yield runs
        return
    yield (run for start, stop in chunks for run in scan(start, stop))


def _claimed_log_id(directory: Path) -> str | None:
    """The log id the genesis line claims; the walker checks the claim, workers only assume it."""
    try:
        with open(directory / segment_name(0), "rb") as f:
            first = f.readline(64 * 1024).rstrip(b"\n")
    except OSError:
        return None
    rec, _ = parse_record(first)
    if rec is None or rec["type"] != GENESIS or not isinstance(rec["data"].get("log"), str):
        return None
    return rec["data"]["log"]


def verify_log(
    directory: Path,
    public_key: Ed25519PublicKey,
    *,
    witness: dict[str, Any] | None = None,
    jobs: int | None = None,
    fast: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
) -> VerifyReport:
    """Walk every segment of the log in ``directory`` and check it against ``public_key``.

    Also checks the directory's own head.json (a signed checkpoint the writer
    keeps) and, when given, an external ``witness`` (a head.json kept elsewhere):
    the log must contain the checkpointed record with the same hash.

    ``jobs``: worker processes for segments from PARALLEL_MIN_BYTES on (default:
    the CPUs this process may use). ``fast`` False walks every line through the
    one-line-at-a-time checks only (the reference the tests compare with; the
    result is the same, only slower). ``chunk_bytes``: the scan's unit of work.
    """
    directory = Path(directory)
    live = is_live(directory)
    report = VerifyReport(ok=False, records=0, live=live)
    # head.json is read before the segments: on a live log it can only be
    # behind what we read next, never ahead.
    local_head = _read_head(directory, report)
    indexes = list_segments(directory)
    report.segments = len(indexes)
    walker = Walker(public_key)
    walker.witness_seqs = frozenset(
        w["seq"] for w in (witness, local_head) if w is not None and type(w.get("seq")) is int
    )
    if jobs is None:
        jobs = len(os.sched_getaffinity(0))
    log_id = _claimed_log_id(directory) if fast else None

    def finish(problem: Problem | None) -> VerifyReport:
        report.records = walker.records
        report.log_id = walker.log_id
        c = walker.committed
        if c.checkpoint is not None:
            report.last_checkpoint = {
                "seq": c.checkpoint["data"]["seq"],
                "hash": c.checkpoint["data"]["hash"],
                "ts": c.checkpoint["ts"],
                "segment": c.segment,
            }
        report.first_problem = problem
        report.ok = problem is None
        return report

    if not indexes:
        return finish(Problem(segment_name(0), 0, 0, f"no audit segments in {directory}"))
    previous_size: int | None = None
    sealed_after: int | None = None
    for index in range(indexes[-1] + 1):
        name = segment_name(index)
        if index not in indexes:
            return finish(
                Problem(name, walker.next_seq, 0, f"segment {name} is missing (the segments on disk skip it)")
            )
        try:
            data = (directory / name).read_bytes()
        except OSError as exc:
            return finish(Problem(name, walker.next_seq, 0, f"cannot read {name}: {exc.strerror}"))
        if index > 0 and walker.pending and sealed_after is None:
            last = walker.last
            return finish(
                Problem(
                    segment_name(index - 1),
                    walker.committed.next_seq,
                    walker.committed.end,
                    f"{walker.pending} record(s) at the end of {segment_name(index - 1)} are not covered by a checkpoint "
                    f"(last seq {last.seq if last else '-'})",
                )
            )
        if fast:
            parallel = jobs if len(data) >= PARALLEL_MIN_BYTES else 1
            with _segment_runs(data, walker, log_id, parallel, chunk_bytes) as runs:
                result = walker.walk_segment(index, data, previous_size, runs)
        else:
            result = walker.walk_segment(index, data, previous_size)
        if result.recoveries:
            report.warnings.append(
                f"{name}: {result.recoveries} tail(s) cut on recovery (after a crash, a failed write or foreign "
                f"bytes; each audit.recover record names the bytes' length and sha256)"
            )
        sealed_after = None
        if index < indexes[-1] and (result.problem is not None or walker.pending):
            sealed_after = _sealed_tail(directory, index, data, walker.committed.end)
        if sealed_after is not None:
            walker.seal()
            report.warnings.append(
                f"{name}: {len(data) - sealed_after} byte(s) after byte {sealed_after} are not part of the log; "
                f"the daemon found them there and sealed the segment ({segment_name(index + 1)} begins with the "
                f"signed record of their length and sha256)"
                + (f"; first problem in them: {result.problem.message}" if result.problem is not None else "")
            )
            previous_size = sealed_after
            continue
        if result.problem is not None:
            if result.torn and live and index == indexes[-1]:
                report.warnings.append(f"{result.problem} (the writer is live: a batch is being written)")
                break
            return finish(result.problem)
        previous_size = len(data)
    if walker.pending:
        first_pending = walker.committed.next_seq
        message = (
            f"{walker.pending} record(s) from seq {first_pending} are not covered by a checkpoint yet"
        )
        if live:
            report.warnings.append(f"{message} (the writer is live)")
        else:
            last = walker.last
            assert last is not None
            # Reported at the last line: that is where a checkpoint must be and is not.
            return finish(
                Problem(
                    last.segment,
                    last.seq,
                    last.offset,
                    f"the log ends at seq {last.seq} without a checkpoint: {message}; a torn tail that was "
                    f"never recovered (opening the log with the daemon recovers it), or a cut",
                )
            )
    seen_hashes = walker.witness_seen
    for w, label in ((witness, "witness"), (local_head, HEAD_NAME)):
        if w is None:
            continue
        why = _witness_problem(w, public_key, walker.log_id)
        if why is None and seen_hashes.get(w["seq"]) is None:
            why = (
                f"{label} names checkpointed seq {w['seq']}, but the log's proven records end at seq "
                f"{walker.committed.next_seq - 1}: the log was truncated or rolled back"
            )
        elif why is None and seen_hashes[w["seq"]] != w["hash"]:
            why = f"{label} names seq {w['seq']} with hash {w['hash']}, but the log holds a different line there"
        if why is not None:
            seg = w.get("segment") if isinstance(w.get("segment"), str) else segment_name(indexes[-1])
            seq = w.get("seq") if type(w.get("seq")) is int else None
            return finish(Problem(seg, seq, 0, f"{label}: {why}" if not why.startswith(label) else why))
    return finish(None)


def _sealed_tail(directory: Path, index: int, data: bytes, chain_end: int) -> int | None:
    """``chain_end`` when the next segment's audit.segment record seals exactly the bytes after it, else None.

    The record itself (its link, its checkpoint's signature) is verified when
    the next segment is walked; here only the claim is matched to the bytes.
    """
    try:
        first = read_first_line(directory / segment_name(index + 1))
    except OSError:
        return None
    rec, _ = parse_record(first)
    if rec is None or rec["type"] != SEGMENT:
        return None
    d = rec["data"]
    if (
        d.get("previous_bytes") != chain_end
        or d.get("sealed_bytes") != len(data) - chain_end
        or d.get("sealed_sha256") != hashlib.sha256(data[chain_end:]).hexdigest()
    ):
        return None
    return chain_end


def _read_head(directory: Path, report: VerifyReport) -> dict[str, Any] | None:
    path = directory / HEAD_NAME
    try:
        head = json.loads(path.read_text())
    except FileNotFoundError:
        report.warnings.append(f"{path} is missing: only an external witness can detect a cut tail")
        return None
    except (OSError, ValueError) as exc:
        report.warnings.append(f"{path} cannot be read ({exc}); ignoring it")
        return None
    if not isinstance(head, dict):
        report.warnings.append(f"{path} is not a JSON object; ignoring it")
        return None
    return head


def pinned_public_key(home: Home, config: Any, explicit_hex: str | None) -> Ed25519PublicKey:
    """The key verify trusts: ``--pubkey``, else ``audit.pubkey``, else the home's daemon key.

    Never a key found only inside the log: whoever can rewrite the log could
    write their own key there. ``config`` is a Config, an AuditConfig or None.
    """
    audit = getattr(config, "audit", config)
    for source, value in (("--pubkey", explicit_hex), ("audit.pubkey in covenant.toml", getattr(audit, "pubkey", None))):
        if value:
            try:
                return public_key_from_hex(value.strip())
            except ValueError as exc:
                raise ConfigError(f"{source}: {exc}") from None
    path = home.daemon_key_path
    if not path.exists():
        raise ConfigError(
            f"no public key to verify against: pass --pubkey HEX, set audit.pubkey in {home.config_path}, "
            f"or run where {path} exists"
        )
    return load_private_key(path).public_key()

