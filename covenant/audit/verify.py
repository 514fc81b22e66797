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
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from covenant.audit.format import HEX64_RE, checkpoint_signature_ok, segment_name
from covenant.audit.scan import Problem, Walker
from covenant.audit.store import HEAD_NAME, LOCK_NAME, list_segments
from covenant.errors import ConfigError
from covenant.home import Home
from covenant.keys import load_private_key, public_key_from_hex

__all__ = ["VerifyReport", "Problem", "verify_log", "pinned_public_key", "is_live", "load_witness"]


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


def verify_log(directory: Path, public_key: Ed25519PublicKey, *, witness: dict[str, Any] | None = None) -> VerifyReport:
    """Walk every segment of the log in ``directory`` and check it against ``public_key``.

    Also checks the directory's own head.json (a signed checkpoint the writer
    keeps) and, when given, an external ``witness`` (a head.json kept elsewhere):
    the log must contain the checkpointed record with the same hash.
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
        if index > 0 and walker.pending:
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
        result = walker.walk_segment(index, data, previous_size)
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

