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
    write_events_sync(home.audit_dir, key, sequential=3, concurrent=2, agent="echo@local")
    # No agent is loaded: a full id is taken as written (the records of an agent no longer loaded)...
    out = subprocess.run(
        [COVENANT, "audit", "tail", "--agent", "echo@local"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert len(out) == 3
    assert "agent.exited" in out[0] and "agent=echo@local" in out[0] and "intent=i0" in out[0] and "outcome=ok" in out[0]
    # ...a bare name must name a loaded agent, and one no record names either is an error, not an empty answer.
    for unknown in ("echo", "ghost@local"):
        refused = subprocess.run([COVENANT, "audit", "tail", "--agent", unknown], capture_output=True, text=True)
        assert refused.returncode == 6 and refused.stdout == ""
        assert f"no agent with id {unknown!r} is loaded (loaded: none;" in refused.stderr
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


def test_tail_starts_with_the_last_ten_and_says_when_nothing_matches(home: Home, key: Ed25519PrivateKey) -> None:
    write_events_sync(home.audit_dir, key, sequential=14)

    def tail(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([COVENANT, "audit", "tail", *args], capture_output=True, text=True, check=True)

    whole = [json.loads(x) for x in tail("--json", "-n", "1000").stdout.splitlines()]
    assert len(whole) > 14
    last = [json.loads(x) for x in tail("--json").stdout.splitlines()]
    assert last == whole[-10:]
    shown = tail().stdout.splitlines()
    assert [int(line.split()[0]) for line in shown] == list(range(1, 11))  # numbered within this listing
    assert "intent=i13" in shown[-1] and f"seq={whole[-1]['seq']} " in shown[-1]
    assert len(tail("-n", "3").stdout.splitlines()) == 3
    assert tail("-n", "0").stdout == "" and tail("-n", "0").stderr == ""  # records matched: nothing to say

    empty = tail("--type", "nothing.*")
    assert empty.stdout == "" and empty.stderr == "no records of type nothing.*\n"
    assert tail("--type", "nothing.*", "--json").stdout == "" == tail("--type", "nothing.*", "--json").stderr

    # -f starts from the same last ten, then follows.
    proc = _covenant(home, "audit", "tail", "-f", "--json", "--type", "agent.exited", "--interval", "0.05")
    try:
        out = _Lines(proc.stdout)
        out.wait_for(lambda lines: len(lines) == 10)
        assert [json.loads(x)["data"]["intent"] for x in out.lines] == [f"i{n}" for n in range(4, 14)]
        write_events_sync(home.audit_dir, key, sequential=2)
        out.wait_for(lambda lines: len(lines) == 12)
        assert [json.loads(x)["data"]["intent"] for x in out.lines[10:]] == ["i0", "i1"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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
