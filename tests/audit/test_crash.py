"""kill -9 during a burst, many times: every acknowledged record survives and verify passes."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.reader import Entry, iter_records
from covenant.audit.verify import verify_log
from covenant.audit.writer import AuditLog
from covenant.config import AuditConfig

KILLS = 50
WRITERS = 16


def _child(directory: Path, key_bytes: bytes, acks_path: Path, round_: int) -> None:
    """The writer under test, in its own process: writes acked seqs to a file after record() returns."""
    key = Ed25519PrivateKey.from_private_bytes(key_bytes)
    acks = os.open(acks_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    async def main() -> None:
        async with AuditLog.open(directory, key, AuditConfig(segment_bytes=64 * 1024)) as log:

            async def writer(w: int) -> None:
                for n in range(1_000_000):
                    seq = await log.record("intent.received", {"round": round_, "w": w, "n": n})
                    os.write(acks, f"{seq} {round_} {w} {n}\n".encode())

            async with trio.open_nursery() as nursery:
                for w in range(WRITERS):
                    nursery.start_soon(writer, w)

    trio.run(main)


def _recover(directory: Path, key: Ed25519PrivateKey) -> None:
    async def main() -> None:
        async with AuditLog.open(directory, key, AuditConfig(segment_bytes=64 * 1024)):
            pass

    trio.run(main)


def test_kill_9_during_a_burst(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    key_bytes = key.private_bytes_raw()
    rng = random.Random(int(os.environ.get("AUDIT_CRASH_SEED", "4")))
    fork = multiprocessing.get_context("fork")
    total_acked = 0
    for kill in range(KILLS):
        directory = tmp_path / f"log{kill // 10}"  # a fresh log every 10 kills keeps verify cheap
        acks_path = tmp_path / f"acks{kill}"
        child = fork.Process(target=_child, args=(directory, key_bytes, acks_path, kill))
        child.start()
        deadline = time.monotonic() + 20
        while not (acks_path.exists() and acks_path.stat().st_size > 0):
            assert time.monotonic() < deadline, "child never acknowledged a record"
            assert child.is_alive(), f"child exited with {child.exitcode}"
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.08))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL

        _recover(directory, key)  # reopen: recovery runs
        report = verify_log(directory, key.public_key())
        assert report.ok, f"kill {kill}: {report.first_problem}"

        acked = {}
        text = acks_path.read_text()
        # SIGKILL can cut the child's last ack write where it crosses a page boundary of the file:
        # only whole lines are acknowledgments.
        for line in text[: text.rfind("\n") + 1].splitlines():
            seq, round_, w, n = map(int, line.split())
            acked[seq] = (round_, w, n)
        present = {
            e.seq: (e.record["data"]["round"], e.record["data"]["w"], e.record["data"]["n"])
            for e in iter_records(directory)
            if isinstance(e, Entry) and e.type == "intent.received"
        }
        for seq, what in acked.items():
            assert present.get(seq) == what, f"kill {kill}: acknowledged seq {seq} {what} is missing or different"
        total_acked += len(acked)
    assert total_acked > KILLS
