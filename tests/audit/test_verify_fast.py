"""verify's fast scan (chunks, runs, worker processes) finds exactly what the line-by-line walk finds.

Every damaged log here is verified three ways, which must give the same
report (outcome, first problem's segment, seq, offset and message, records,
warnings, last checkpoint): ``fast=False`` (each line through the walker),
the fast scan in this process with several chunk sizes (so runs start and end
at every kind of line), and the fast scan in forked workers (in a fresh,
single-threaded child process, as the CLI runs it).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit import verify
from covenant.audit.format import HEARTBEAT, timestamp
from covenant.audit.scan import scan_runs
from covenant.audit.store import LogFiles
from covenant.audit.verify import verify_log
from covenant.keys import public_key_hex

from .conftest import read_lines, rechain, segment, write_events_sync, write_lines

CHUNK_SIZES = (1, 97, 700, 4096)


def _report(directory: Path, key: Ed25519PrivateKey, **options: Any) -> dict[str, Any]:
    return verify_log(directory, key.public_key(), **options).to_json()


@pytest.fixture(scope="module")
def module_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def base_log(tmp_path_factory: pytest.TempPathFactory, module_key: Ed25519PrivateKey) -> Path:
    """Several segments, single events, batches, heartbeats and a recovery."""
    directory = tmp_path_factory.mktemp("fast") / "audit"
    write_events_sync(directory, module_key, sequential=8, concurrent=20, segment_bytes=4096)
    files = LogFiles.open(directory, module_key, 4096, lambda fd: None)
    try:  # what the writer appends when idle
        files.append([(HEARTBEAT, b"{}", timestamp())])
        files.append([(HEARTBEAT, b"{}", timestamp())])
        files.write_head()
    finally:
        files.close()
    write_events_sync(directory, module_key, sequential=3, segment_bytes=4096)
    last = sorted(directory.glob("audit-*.jsonl"))[-1]
    data = last.read_bytes()
    last.write_bytes(data[: len(data) - 40])  # a torn batch: reopening writes audit.recover
    write_events_sync(directory, module_key, sequential=4, concurrent=9, segment_bytes=4096)
    assert len(list(directory.glob("audit-*.jsonl"))) >= 3
    assert any(b"audit.recover" in line for line in read_lines(last))
    assert any(b"audit.heartbeat" in line for p in directory.glob("audit-*.jsonl") for line in read_lines(p))
    return directory


def _copy(base: Path, into: Path) -> Path:
    into.mkdir()
    for path in base.iterdir():
        (into / path.name).write_bytes(path.read_bytes())
    return into


def _edit_and_rechain(lines: list[bytes], i: int) -> list[bytes]:
    """Change a number in line ``i`` and fix every later prev (lines that are not JSON stay as they are)."""
    out = lines[:i] + [lines[i].replace(b'"n":', b'"n":1')] + lines[i + 1 :]
    for k in range(max(i + 1, 1), len(out)):
        try:
            out[k : k + 1] = rechain([out[k - 1], out[k]], 1)[1:]
        except ValueError:
            continue
    return out


def _damaged_logs(base: Path, root: Path) -> list[Path]:
    """The clean log and many damaged copies of it, each in its own directory."""
    rng = random.Random(4)
    out = [_copy(base, root / "clean")]
    segments = sorted(p.name for p in base.glob("audit-*.jsonl"))

    def variant(name: str, segment_name: str, edit: Any) -> None:
        directory = _copy(base, root / name)
        lines = read_lines(directory / segment_name)
        write_lines(directory / segment_name, edit(lines))
        out.append(directory)

    for s, segment_name in enumerate(segments):
        count = len(read_lines(base / segment_name))
        picks = sorted({0, 1, 2, count // 2, count - 2, count - 1, *rng.sample(range(count), min(6, count))})
        for i in picks:
            variant(f"del-{s}-{i}", segment_name, lambda ls, i=i: ls[:i] + ls[i + 1 :])
            variant(f"dup-{s}-{i}", segment_name, lambda ls, i=i: ls[: i + 1] + [ls[i]] + ls[i + 1 :])
            if i + 1 < count:
                variant(f"swap-{s}-{i}", segment_name, lambda ls, i=i: ls[:i] + [ls[i + 1], ls[i]] + ls[i + 2 :])
            variant(
                f"edit-rechain-{s}-{i}",
                segment_name,
                lambda ls, i=i: _edit_and_rechain(ls, i),
            )
            variant(f"cut-{s}-{i}", segment_name, lambda ls, i=i: ls[:i])
        for n in range(12):
            directory = _copy(base, root / f"flip-{s}-{n}")
            path = directory / segment_name
            data = bytearray(path.read_bytes())
            offset = rng.randrange(len(data))
            data[offset] ^= rng.choice((0x01, 0x02, 0x20, 0x80))
            path.write_bytes(bytes(data))
            out.append(directory)
        directory = _copy(base, root / f"torn-{s}")
        path = directory / segment_name
        path.write_bytes(path.read_bytes()[:-7])
        out.append(directory)
    directory = _copy(base, root / "no-head")
    (directory / "head.json").unlink()
    out.append(directory)
    return out


def test_fast_scan_in_process_matches_the_line_by_line_walk(
    base_log: Path, module_key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    logs = _damaged_logs(base_log, tmp_path)
    failed = 0
    for directory in logs:
        expected = _report(directory, module_key, fast=False)
        failed += not expected["ok"]
        for chunk in CHUNK_SIZES:
            assert _report(directory, module_key, chunk_bytes=chunk, jobs=1) == expected, (directory.name, chunk)
    assert _report(logs[0], module_key)["ok"]
    assert failed >= len(logs) // 2  # the damage is real


def test_witness_handling_matches(base_log: Path, module_key: Ed25519PrivateKey, tmp_path: Path) -> None:
    directory = _copy(base_log, tmp_path / "w")
    head = json.loads((directory / "head.json").read_text())
    old = dict(head, seq=head["seq"] - 3)  # a witness whose hash does not match that seq
    for witness in (head, old, None):
        for chunk in CHUNK_SIZES:
            got = verify_log(directory, module_key.public_key(), witness=witness, chunk_bytes=chunk).to_json()
            assert got == verify_log(directory, module_key.public_key(), witness=witness, fast=False).to_json()
    last = sorted(directory.glob("audit-*.jsonl"))[-1]
    write_lines(last, read_lines(last)[:-4])  # cut behind the witnessed checkpoint
    for chunk in CHUNK_SIZES:
        got = verify_log(directory, module_key.public_key(), witness=head, chunk_bytes=chunk).to_json()
        assert got == verify_log(directory, module_key.public_key(), witness=head, fast=False).to_json()
        assert not got["ok"]


_CHILD = """
import json, sys, threading
from pathlib import Path
import covenant.audit.verify as v
from covenant.keys import public_key_from_hex
v.PARALLEL_MIN_BYTES = 0  # these logs are small: use the workers anyway
assert threading.active_count() == 1  # so verify forks its workers
key = public_key_from_hex(sys.argv[1])
out = []
for d in sys.argv[2:]:
    for chunk in (97, 1500):
        out.append(v.verify_log(Path(d), key, jobs=2, chunk_bytes=chunk).to_json())
print(json.dumps(out))
"""


def test_fast_scan_in_worker_processes_matches(base_log: Path, module_key: Ed25519PrivateKey, tmp_path: Path) -> None:
    logs = _damaged_logs(base_log, tmp_path)[::3]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, public_key_hex(module_key), *map(str, logs)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    got = json.loads(proc.stdout)
    expected = [_report(d, module_key, fast=False) for d in logs for _ in (97, 1500)]
    assert got == expected


def test_big_log_verifies_in_workers(tmp_path: Path, module_key: Ed25519PrivateKey) -> None:
    """Segments above PARALLEL_MIN_BYTES take the worker path with its real thresholds."""
    directory = tmp_path / "audit"
    write_events_sync(directory, module_key, sequential=2, concurrent=24_000)
    assert segment(directory).stat().st_size >= verify.PARALLEL_MIN_BYTES
    script = (
        "import json,sys; from pathlib import Path; from covenant.audit.verify import verify_log;"
        "from covenant.keys import public_key_from_hex;"
        "print(json.dumps(verify_log(Path(sys.argv[2]), public_key_from_hex(sys.argv[1])).to_json()))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, public_key_hex(module_key), str(directory)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    got = json.loads(proc.stdout)
    assert got["ok"] and got == _report(directory, module_key, fast=False)


def test_runs_cover_every_ordinary_line(base_log: Path, module_key: Ed25519PrivateKey) -> None:
    """On a clean log the scan leaves to the walker only what only it can check."""
    log_id = json.loads((base_log / "head.json").read_text())["log"]
    for path in sorted(base_log.glob("audit-*.jsonl")):
        data = path.read_bytes()
        lines = read_lines(path)
        runs = scan_runs(data, 0, len(data), log_id, module_key.public_key())
        covered = sum(run.lines for run in runs)
        left = [line for line in lines if b'"type":"audit.checkpoint"' not in line and b'"type":"audit.heartbeat"' not in line]
        # Left to the walker: the segment's first line, audit.recover and the bytes it discards.
        assert len(lines) - covered == 1 + sum(
            b'"type":"audit.recover"' in line or not line.endswith(b'"v":1}') for line in left
        ), path.name
        assert all(a.end <= b.start for a, b in zip(runs, runs[1:]))


def test_a_dying_scan_child_only_costs_speed(base_log: Path, module_key: Ed25519PrivateKey) -> None:
    """A forked scanner that dies (OOM killer, a signal) leaves its chunks to the parent, which scans them."""
    import os

    data = sorted(base_log.glob("audit-*.jsonl"))[-1].read_bytes()
    log_id = json.loads((base_log / "head.json").read_text())["log"]
    chunks = verify._chunks(data, 300)
    parent = os.getpid()

    def scan(start: int, stop: int) -> list[Any]:
        if os.getpid() != parent and start > chunks[len(chunks) // 2][0]:
            os._exit(9)  # this child dies half way through its share
        return scan_runs(data, start, stop, log_id, module_key.public_key())

    with verify._forked_runs(chunks, scan, 2) as runs:
        got = list(runs)
    assert got == [run for start, stop in chunks for run in scan_runs(data, start, stop, log_id, module_key.public_key())]
