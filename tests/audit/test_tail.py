"""`covenant audit tail` as a real subprocess: filters, -f across appends and segment changes, shrink."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.home import Home

from .conftest import segment, write_events_sync

COVENANT = str(Path(sys.executable).with_name("covenant"))  # the installed console script


def _covenant(home: Home, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [COVENANT, "--home", str(home.root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        **kwargs,  # type: ignore[arg-type]
    )


class _Lines:
    """Collect a pipe's lines in a thread so the test can wait for them without blocking forever."""

    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not predicate(self.lines):
            assert time.monotonic() < deadline, f"timed out; got {self.lines[-5:]}"
            time.sleep(0.02)


def test_tail_prints_and_filters(home: Home, key: Ed25519PrivateKey) -> None:
    write_events_sync(home.audit_dir, key, sequential=3, concurrent=2)
    out = subprocess.run(
        [COVENANT, "audit", "tail", "--agent", "echo"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert len(out) == 3
    assert "agent.exited" in out[0] and "agent=echo" in out[0] and "intent=i0" in out[0] and "outcome=ok" in out[0]
    out = subprocess.run(
        [COVENANT, "audit", "tail", "--json", "--type", "intent.*"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert [json.loads(x)["type"] for x in out] == ["intent.received"] * 2
    out = subprocess.run(
        [COVENANT, "audit", "tail", "--json", "-n", "1", "--type", "audit.checkpoint"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert len(out) == 1 and json.loads(out[0])["type"] == "audit.checkpoint"


def test_tail_follow_appends_and_segment_changes(home: Home, key: Ed25519PrivateKey) -> None:
    write_events_sync(home.audit_dir, key, sequential=1)
    proc = _covenant(home, "audit", "tail", "-f", "--json", "--type", "*", "--interval", "0.05")
    try:
        out = _Lines(proc.stdout)
        err = _Lines(proc.stderr)
        out.wait_for(lambda lines: len(lines) >= 4)
        # A daemon-like writer appends while the tail runs, rolling segments every few KiB.
        write_events_sync(home.audit_dir, key, sequential=40, segment_bytes=4096)
        assert (home.audit_dir / "audit-000002.jsonl").exists()
        total = sum(1 for p in home.audit_dir.glob("audit-*.jsonl") for _ in p.read_bytes().splitlines())
        out.wait_for(lambda lines: len(lines) >= total)
        seqs = [json.loads(x)["seq"] for x in out.lines]
        assert seqs == list(range(total))
        assert not [x for x in err.lines if "WARNING" in x], err.lines

        # Someone cuts the current segment: the tail says so loudly.
        last = max(home.audit_dir.glob("audit-*.jsonl"))
        data = last.read_bytes()
        last.write_bytes(data[: len(data) // 2])
        err.wait_for(lambda lines: any("shrank" in x for x in lines))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_tail_follow_waits_for_a_log_that_does_not_exist_yet(home: Home, key: Ed25519PrivateKey) -> None:
    proc = _covenant(home, "audit", "tail", "-f", "--interval", "0.05")
    try:
        out = _Lines(proc.stdout)
        time.sleep(0.3)
        write_events_sync(home.audit_dir, key, sequential=2)
        out.wait_for(lambda lines: sum("agent.exited" in x for x in lines) == 2)
        assert segment(home.audit_dir).exists()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
