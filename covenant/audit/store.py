"""The blocking half of the writer: files, locks, appends, roll-over, recovery.

Everything here runs in the audit writer process
(:mod:`covenant.audit.writer_process`), which owns the one LogFiles. Each
append writes the batch plus its checkpoint in one ``write()`` and then calls
``fsync`` (``os.fdatasync`` unless a test passes another OS-boundary function).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.errors import AuditLogError, AuditUnavailable
from covenant.audit.format import (
    CHECKPOINT,
    FORMAT,
    GENESIS,
    RECOVER,
    SEGMENT,
    ZERO_HASH,
    build_line,
    checkpoint_signature_ok,
    line_hash,
    parse_record,
    segment_index,
    segment_name,
    sign_checkpoint,
    timestamp,
)
from covenant.audit.scan import Walker
from covenant.canonical import canonical_bytes
from covenant.durable import fsync_dir, write_all
from covenant.keys import public_key_hex

__all__ = [
    "LogFiles",
    "Item",
    "HEAD_NAME",
    "LOCK_NAME",
    "list_segments",
    "write_atomic",
    "read_first_line",
    "unavailable",
]

HEAD_NAME = "head.json"
LOCK_NAME = "lock"
FILE_MODE = 0o640
DIR_MODE = 0o750

Item = tuple[str, bytes, str]  # (type, canonical data bytes, ts)


def list_segments(directory: Path) -> list[int]:
    """Indexes of the segment files present, sorted."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(i for i in (segment_index(n) for n in names) if i is not None)


def read_first_line(path: Path) -> bytes:
    """The first line of a file without its newline (at most 1 MiB read)."""
    with open(path, "rb") as f:
        return f.readline(1 << 20).rstrip(b"\n")


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def write_atomic(path: Path, data: bytes, fsync: Callable[[int], None] = os.fsync) -> None:
    """Replace ``path``: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    try:
        write_all(fd, data)
        fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent, fsync)


class _State(NamedTuple):
    """Where the log stands: the open segment's index and size, the next seq, the last line's hash, head.json."""

    index: int
    size: int
    next_seq: int
    prev: str
    head: dict[str, Any]


class LogFiles:
    """One open audit log directory, locked against a second writer."""

    def __init__(
        self,
        directory: Path,
        key: Ed25519PrivateKey,
        segment_bytes: int,
        fsync: Callable[[int], None],
        lock_fd: int,
    ) -> None:
        self.directory = directory
        self.key = key
        self.pubkey_hex = public_key_hex(key)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._lock_fd = lock_fd
        self._fd = -1
        self.log_id = ""
        self.state = _State(0, 0, 0, ZERO_HASH, {})
        self.recovered: dict[str, Any] | None = None  # data of the audit.recover written on open, if any
        self.sealed: dict[str, Any] | None = None  # the last segment sealed over foreign or damaged bytes, if any

    # -- opening ---------------------------------------------------------------

    @classmethod
    def open(
        cls, directory: Path, key: Ed25519PrivateKey, segment_bytes: int, fsync: Callable[[int], None]
    ) -> "LogFiles":
        """Lock the directory, then create a new log or recover the existing one."""
        directory.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise AuditLogError(
                f"{directory}: another process is writing this audit log (is a covenant daemon already running?)",
                path=str(directory),
                locked=True,
            ) from None
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)
        files = cls(directory, key, segment_bytes, fsync, lock_fd)
        try:
            for name in os.listdir(directory):
                if name.endswith(".tmp"):  # a roll-over or head update that never reached its rename
                    os.unlink(directory / name)
            if list_segments(directory):
                files._resume()
            else:
                files._create()
            files.write_head()
        except BaseException:
            files.close()
            raise
        return files

    def _create(self) -> None:
        self.log_id = os.urandom(16).hex()  # what secrets.token_hex does; secrets imports random
        data = canonical_bytes({"format": FORMAT, "log": self.log_id, "pubkey": self.pubkey_hex})
        content, last_hash, head = self._lines([(GENESIS, data, timestamp())], 0, ZERO_HASH)
        self._new_segment_file(0, content)
        self.state = _State(0, len(content), 2, last_hash, head)

    def _resume(self) -> None:
        indexes = list_segments(self.directory)
        if indexes[0] != 0 or indexes != list(range(indexes[-1] + 1)):
            missing = sorted(set(range(indexes[-1] + 1)) - set(indexes))
            raise AuditLogError(
                f"{self.directory}: audit segment(s) {', '.join(segment_name(i) for i in missing)} are missing; "
                f"run `covenant audit verify` and move the directory aside to start a new log",
                path=str(self.directory),
            )
        genesis, why = parse_record(read_first_line(self.directory / segment_name(0)))
        if genesis is None or genesis["type"] != GENESIS:
            raise AuditLogError(f"{self.directory / segment_name(0)}: first line is not audit.genesis ({why})")
        if genesis["data"].get("pubkey") != self.pubkey_hex:
            raise AuditLogError(
                f"{self.directory}: this audit log was started by public key {genesis['data'].get('pubkey')}, "
                f"but the daemon key is {self.pubkey_hex}; restore the original identity/daemon.key "
                f"or move the audit directory aside to start a new log",
                path=str(self.directory),
            )
        self.log_id = genesis["data"]["log"]
        last = indexes[-1]
        path = self.directory / segment_name(last)
        data = path.read_bytes()
        walker = Walker(None, expected_pubkey_hex=self.pubkey_hex)
        previous_size = None
        if last > 0:
            first, why = parse_record(data.split(b"\n", 1)[0])
            if first is None or first["type"] != SEGMENT:
                raise AuditLogError(f"{path}: first line is not audit.segment ({why})", path=str(path))
            walker.start_mid_log(first["seq"], first["prev"], self.log_id)
            previous_size = (self.directory / segment_name(last - 1)).stat().st_size
            sealed = first["data"].get("sealed_bytes")
            if type(sealed) is int and first["data"].get("previous_bytes") == previous_size - sealed:
                previous_size -= sealed  # the chain ended before the bytes this record sealed
        else:
            walker.log_id = None
        result = walker.walk_segment(last, data, previous_size)
        committed = walker.committed
        if committed.checkpoint is None:
            raise AuditLogError(f"{path}: no checkpoint found; the segment is damaged from its start", path=str(path))
        cp = committed.checkpoint["data"]
        if not checkpoint_signature_ok(self.key.public_key(), self.log_id, cp["seq"], cp["hash"], cp["sig"]):
            raise AuditLogError(
                f"{path}: the last checkpoint (seq {committed.next_seq - 1}) does not verify; "
                f"run `covenant audit verify`",
                path=str(path),
            )
        self._fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
        head = self._head_for(committed.checkpoint, committed.segment or segment_name(last))
        self.state = _State(last, len(data), committed.next_seq, committed.prev, head)
        valid = committed.end
        if result.problem is None and walker.pending == 0 and valid == len(data):
            return
        self._check_tail_is_torn(path, data, valid, str(result.problem) if result.problem else "")
        self._recover(path, data, valid)

    def _check_tail_is_torn(self, path: Path, data: bytes, valid: int, problem: str) -> None:
        """Refuse to paper over damage: a torn write holds at most one (final, unacknowledged) batch.

        A signed checkpoint inside the bytes to discard that is not their last
        complete line means acknowledged history would be dropped. (Bytes that
        someone appends while the daemon runs never get this far: the writer
        seals them out of the chain before its next write, see ``append``.)
        """
        lines = data[valid:].split(b"\n")[:-1]  # complete lines only
        for n, line in enumerate(lines):
            if b'"type":"audit.checkpoint"' not in line:
                continue
            rec, _ = parse_record(line)
            if rec is None or rec["type"] != CHECKPOINT:
                continue
            d = rec["data"]
            signed = checkpoint_signature_ok(self.key.public_key(), self.log_id, d.get("seq"), d.get("hash"), d.get("sig"))
            if signed and n != len(lines) - 1:
                raise AuditLogError(
                    f"{path}: the log is damaged at byte {valid} or after ({problem}) and signed checkpoints "
                    f"follow the damage: this is not a torn write, so covenant will not discard it. "
                    f"Run `covenant audit verify`, keep a copy, and move the audit directory aside to start a new log",
                    path=str(path),
                )

    def _foreign_tail(self) -> tuple[int, str] | None:
        """Bytes someone else appended to the open segment since our last write: (count, sha256), or None."""
        size = os.fstat(self._fd).st_size
        start = self.state.size
        if size <= start:
            return None
        digest = hashlib.sha256()
        path = self.directory / segment_name(self.state.index)
        with open(path, "rb") as f:
            f.seek(start)
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return size - start, digest.hexdigest()

    def _recover(self, path: Path, data: bytes, valid: int) -> None:
        tail = data[valid:]
        pad = b"" if tail.endswith(b"\n") else b"\n"
        discarded = tail + pad
        recover = {
            "discarded_bytes": len(discarded),
            "discarded_sha256": hashlib.sha256(discarded).hexdigest(),
            "segment": path.name,
            "valid_bytes": valid,
        }
        self._append([(RECOVER, canonical_bytes(recover), timestamp())], prefix=pad)
        self.recovered = recover

    # -- writing ---------------------------------------------------------------

    def _head_for(self, checkpoint: dict[str, Any], segment: str) -> dict[str, Any]:
        d = checkpoint["data"]
        return {
            "checkpoint_seq": checkpoint["seq"],
            "format": FORMAT,
            "hash": d["hash"],
            "log": d["log"],
            "pubkey": self.pubkey_hex,
            "segment": segment,
            "seq": d["seq"],
            "sig": d["sig"],
            "ts": checkpoint["ts"],
        }

    def _lines(self, items: list[Item], seq: int, prev: str) -> tuple[bytes, str, dict[str, Any]]:
        """Lines for ``items`` plus their checkpoint; returns (bytes, last hash, head dict)."""
        out: list[bytes] = []
        ts = ""
        for type_, data, ts in items:
            line = build_line(type_, data, prev, seq, ts)
            out.append(line)
            prev = line_hash(line)
            seq += 1
        cp_data = sign_checkpoint(self.key, self.log_id, seq - 1, prev)
        cp_line = build_line(CHECKPOINT, cp_data, prev, seq, ts)
        out.append(cp_line)
        checkpoint = {"data": json.loads(cp_data), "seq": seq, "ts": ts}
        return b"\n".join(out) + b"\n", line_hash(cp_line), self._head_for(checkpoint, segment_name(self.state.index))

    def _new_segment_file(self, index: int, content: bytes) -> None:
        """Create a segment whole (temp file + rename), so a segment never exists without its first checkpoint."""
        path = self.directory / segment_name(index)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
        try:
            write_all(fd, content)
            self.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        fsync_dir(self.directory, self.fsync)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)

    def _roll(self, sealed: tuple[int, str] | None = None) -> None:
        """Start the next segment. ``sealed``: (count, sha256) of bytes after the chain's end in this one."""
        s = self.state
        fields: dict[str, Any] = {
            "previous": segment_name(s.index),
            "previous_bytes": s.size,
            "previous_last_hash": s.prev,
            "previous_last_seq": s.next_seq - 1,
            "segment": s.index + 1,
        }
        if sealed is not None:
            fields["sealed_bytes"], fields["sealed_sha256"] = sealed
        data = canonical_bytes(fields)
        self.state = _State(s.index + 1, 0, s.next_seq, s.prev, s.head)
        content, last_hash, head = self._lines([(SEGMENT, data, timestamp())], s.next_seq, s.prev)
        self._new_segment_file(s.index + 1, content)
        self.state = _State(s.index + 1, len(content), s.next_seq + 2, last_hash, head)

    def _append(self, items: list[Item], prefix: bytes = b"") -> tuple[int, float]:
        s = self.state
        content, last_hash, head = self._lines(items, s.next_seq, s.prev)
        # At our own offset, not O_APPEND: bytes someone appends between our size check and
        # this write are overwritten or left after our batch (and sealed next time), never
        # placed inside it.
        _pwrite_all(self._fd, prefix + content, s.size)
        started = time.perf_counter()
        self.fsync(self._fd)
        took = time.perf_counter() - started
        first = s.next_seq
        self.state = _State(s.index, s.size + len(prefix) + len(content), first + len(items) + 1, last_hash, head)
        return first, took

    def append(self, items: list[Item]) -> tuple[int, float]:
        """Write ``items`` and one checkpoint, make them durable; returns (first seq, fsync seconds).

        Raises OSError when the write or the sync fails: then nothing of the
        batch may be acknowledged and the caller must stop using this log.
        """
        if self._fd < 0:
            raise OSError(errno.EBADF, "audit log is closed")
        if (foreign := self._foreign_tail()) is not None:
            sealed = {"segment": segment_name(self.state.index), "valid_bytes": self.state.size, "sealed_bytes": foreign[0]}
            self._roll(sealed=foreign)
            self.sealed = sealed
        elif self.state.size >= self.segment_bytes:
            self._roll()
        return self._append(items)

    def reopen(self) -> None:
        """After a failed write or sync: re-read the log from disk and carry on from what is there.

        The descriptor that failed is dropped (after a failed fsync its pages
        cannot be trusted); the last segment is walked again and a tail that
        did not reach the disk whole is cut with an ``audit.recover`` record,
        as on a start after a crash. Raises OSError while the disk still fails.
        """
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.recovered = None
        self._resume()
        self.write_head()

    @property
    def head(self) -> dict[str, Any]:
        return self.state.head

    def write_head(self) -> None:
        """Replace head.json with the latest checkpoint."""
        body = json.dumps(self.state.head, sort_keys=True, indent=2).encode() + b"\n"
        write_atomic(self.directory / HEAD_NAME, body, self.fsync)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = -1


def unavailable(directory: Path, exc: OSError) -> AuditUnavailable:
    """The error every caller sees once the log failed: names the directory and the OS error."""
    return AuditUnavailable(
        f"audit log {directory} cannot be written ({exc.strerror or exc}); covenant refuses to act until "
        f"it can write again (it retries by itself: free space or fix the disk)",
        path=str(directory),
    )
