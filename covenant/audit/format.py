"""The on-disk format of the audit log: lines, checkpoints, segment names.

Pure functions, no I/O. A record is one line of canonical JSON
(``covenant.canonical``) whose keys are, in order, ``data``, ``prev``,
``seq``, ``ts``, ``type``, ``v``. Because that order is also the sorted
order, a line can be assembled from its parts without re-encoding the
whole object, which keeps the writer cheap under load.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
import json.scanner
import re
import time
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from covenant.canonical import canonical_bytes
from covenant.clock import iso_ms
from covenant.keys import verify_signature

__all__ = [
    "FORMAT",
    "ZERO_HASH",
    "GENESIS",
    "CHECKPOINT",
    "RECOVER",
    "SEGMENT",
    "HEARTBEAT",
    "RESUME",
    "AUDIT_ERROR",
    "WRITER_TYPES",
    "TYPE_RE",
    "HEX64_RE",
    "HEX128_RE",
    "TS_RE",
    "RECORD_KEYS",
    "segment_name",
    "segment_index",
    "line_hash",
    "build_line",
    "checkpoint_message",
    "sign_checkpoint",
    "checkpoint_signature_ok",
    "LINE_RE",
    "CHECKPOINT_DATA_RE",
    "canonical_object",
    "parse_record",
    "parse_record_full",
    "timestamp",
]

FORMAT = "covenant-audit/v1"
ZERO_HASH = "0" * 64

GENESIS = "audit.genesis"
CHECKPOINT = "audit.checkpoint"
RECOVER = "audit.recover"
SEGMENT = "audit.segment"
HEARTBEAT = "audit.heartbeat"
RESUME = "audit.resume"
AUDIT_ERROR = "audit.error"
"""An event the log could not encode, recorded in its place (covenant.audit.writer.AuditLog.record_many)."""
# Only the writer itself may emit these; callers of record() get an error.
WRITER_TYPES = frozenset({GENESIS, CHECKPOINT, RECOVER, SEGMENT, HEARTBEAT, RESUME, AUDIT_ERROR})

TYPE_RE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
HEX64_RE = re.compile(r"[0-9a-f]{64}")
HEX128_RE = re.compile(r"[0-9a-f]{128}")
TS_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z")
RECORD_KEYS = ("data", "prev", "seq", "ts", "type", "v")

_SEGMENT_RE = re.compile(r"audit-([0-9]{6})\.jsonl")

# The exact layout build_line produces, as bytes: groups data, prev, seq, ts,
# type. Every part but ``data`` is ASCII that canonical JSON never escapes and
# ``seq`` is written without sign or leading zeros, so a line that matches and
# whose data group is canonical JSON of an object IS the canonical encoding of
# the record those groups describe (see parse_record). Use with
# ``fullmatch(buf, start, end)`` to check one line inside a bigger buffer.
LINE_RE = re.compile(
    rb'\{"data":(\{.*\}),"prev":"([0-9a-f]{64})","seq":(0|[1-9][0-9]*),'
    rb'"ts":"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z)",'
    rb'"type":"([a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+)","v":1\}'
)
# Checkpoint data exactly as sign_checkpoint writes it: groups hash, log, seq, sig.
# Hex and digits need no escaping and the keys are in sorted order, so a match
# is canonical JSON of an object with exactly those four keys.
CHECKPOINT_DATA_RE = re.compile(
    rb'\{"hash":"([0-9a-f]{64})","log":"([0-9a-f]{32})","seq":(0|[1-9][0-9]*),"sig":"([0-9a-f]{128})"\}'
)


def segment_name(index: int) -> str:
    """File name of segment ``index``: ``audit-000000.jsonl``."""
    return f"audit-{index:06d}.jsonl"


def segment_index(name: str) -> int | None:
    """The index encoded in a segment file name, or None for any other file."""
    match = _SEGMENT_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def line_hash(line: bytes) -> str:
    """Hex SHA-256 of a line's bytes without its newline: what ``prev`` and checkpoints name."""
    return hashlib.sha256(line).hexdigest()


def timestamp(now_ns: int | None = None) -> str:
    """UTC time with milliseconds, e.g. ``2026-11-21T23:59:00.123Z``."""
    ns = time.time_ns() if now_ns is None else now_ns
    return iso_ms(ns // 1_000_000)


def build_line(type_: str, data_bytes: bytes, prev: str, seq: int, ts: str) -> bytes:
    """Assemble one canonical record line (without newline) from pre-encoded data.

    ``data_bytes`` must already be canonical JSON of an object and ``type_``
    must match TYPE_RE (so it needs no escaping); the result equals
    ``canonical_bytes(record)`` byte for byte.
    """
    return b"".join(
        (
            b'{"data":',
            data_bytes,
            b',"prev":"',
            prev.encode("ascii"),
            b'","seq":',
            str(seq).encode("ascii"),
            b',"ts":"',
            ts.encode("ascii"),
            b'","type":"',
            type_.encode("ascii"),
            b'","v":1}',
        )
    )


def checkpoint_message(log_id: str, seq: int, hash_hex: str) -> bytes:
    """The exact bytes a checkpoint signs."""
    return f"{FORMAT}\n{log_id}\n{seq}\n{hash_hex}\n".encode("ascii")


def sign_checkpoint(key: Ed25519PrivateKey, log_id: str, seq: int, hash_hex: str) -> bytes:
    """Data of an ``audit.checkpoint`` record covering record ``seq`` whose line hashes to ``hash_hex``."""
    sig = key.sign(checkpoint_message(log_id, seq, hash_hex)).hex()
    return canonical_bytes({"hash": hash_hex, "log": log_id, "seq": seq, "sig": sig})


def checkpoint_signature_ok(public_key: Ed25519PublicKey, log_id: str, seq: int, hash_hex: str, sig_hex: Any) -> bool:
    """True when ``sig_hex`` (lowercase hex only) signs the checkpoint message."""
    if not isinstance(sig_hex, str) or not HEX128_RE.fullmatch(sig_hex):
        return False
    return verify_signature(public_key, bytes.fromhex(sig_hex), checkpoint_message(log_id, seq, hash_hex))


def _reject(text: str) -> Any:
    raise ValueError(f"{text!r} is not allowed (integers only, no NaN/Infinity)")


# The C scanner and encoder: same acceptance as covenant.canonical.parse_strict
# followed by a re-encode comparison (duplicate keys are caught because the
# re-encoded object is shorter), at roughly half the cost. verify must stay
# above 100,000 records/s; tests check the two agree.
# The C scanner and encoder are used directly (not through JSONDecoder.decode /
# JSONEncoder.encode) to skip per-call set-up; both fall back to the pure
# Python implementations when the C accelerator is missing.
_decoder = json.JSONDecoder(parse_float=_reject, parse_constant=_reject)
_scan_once = json.scanner.make_scanner(_decoder)
_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
if json.encoder.c_make_encoder is not None:
    _c_encode = json.encoder.c_make_encoder(
        None, _encoder.default, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )

    def _encode(obj: Any) -> str:
        return "".join(_c_encode(obj, 0))

else:  # pragma: no cover - CPython always ships _json
    _encode = _encoder.encode


def _decode(text: str) -> Any:
    """One JSON value filling all of ``text``: no surrounding whitespace, no BOM."""
    try:
        obj, end = _scan_once(text, 0)
    except StopIteration as exc:
        raise ValueError(f"no JSON value at character {exc.value}") from None
    if end != len(text):
        raise ValueError(f"extra data at character {end}")
    return obj


def canonical_object(raw: bytes) -> dict[str, Any] | None:
    """The object ``raw`` encodes when it is canonical JSON of an object, else None.

    Same acceptance as decoding strictly and re-encoding: invalid UTF-8,
    floats, NaN, duplicate keys, whitespace and any other spelling give None.
    """
    try:
        text = raw.decode("utf-8")
        obj, end = _scan_once(text, 0)
        if end != len(text) or type(obj) is not dict or _encode(obj) != text:
            return None
    except (ValueError, RecursionError, StopIteration):
        return None
    return obj


def parse_record(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """Parse a record line; returns (record, "") or (None, why it is not a valid record line).

    Lines in the writer's layout take a fast path: LINE_RE proves the
    envelope canonical, so only ``data`` is decoded and re-encoded. Anything
    else (and every invalid line) goes through the full decode and
    re-encode, which also says what is wrong. tests/audit/test_tamper.py
    checks that both paths agree.
    """
    match = LINE_RE.fullmatch(line)
    if match is not None:
        data = canonical_object(match.group(1))
        if data is not None:
            return {
                "data": data,
                "prev": match.group(2).decode("ascii"),
                "seq": int(match.group(3)),
                "ts": match.group(4).decode("ascii"),
                "type": match.group(5).decode("ascii"),
                "v": 1,
            }, ""
    return parse_record_full(line)


def parse_record_full(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """parse_record without the fast path: decode the whole line, re-encode, compare."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"invalid UTF-8 at byte {exc.start} of the line"
    try:
        obj = _decode(text)
    except ValueError as exc:  # JSONDecodeError is a ValueError; so are our rejections
        return None, f"not valid JSON for a record: {exc}"
    except RecursionError:
        return None, "JSON nested too deeply"
    try:
        again = _encode(obj)
    except (ValueError, RecursionError) as exc:
        return None, f"not canonical JSON: {exc}"
    if again != text:
        return None, "not canonical JSON (key order, spacing, escapes or duplicate keys differ from the canonical encoding)"
    if type(obj) is not dict or tuple(obj) != RECORD_KEYS:
        return None, f"a record must be an object with exactly the keys {', '.join(RECORD_KEYS)}"
    if obj["v"] != 1 or type(obj["v"]) is not int:
        return None, "unsupported record version (v must be 1)"
    if type(obj["data"]) is not dict:
        return None, "data must be an object"
    seq = obj["seq"]
    if type(seq) is not int or seq < 0:
        return None, "seq must be a non-negative integer"
    prev = obj["prev"]
    if type(prev) is not str or not HEX64_RE.fullmatch(prev):
        return None, "prev must be 64 lowercase hex characters"
    ts = obj["ts"]
    if type(ts) is not str or not TS_RE.fullmatch(ts):
        return None, "ts must look like 2026-11-21T23:59:00.123Z"
    type_ = obj["type"]
    if type(type_) is not str or not TYPE_RE.fullmatch(type_):
        return None, "type must be dotted lowercase words, e.g. intent.received"
    return obj, ""
