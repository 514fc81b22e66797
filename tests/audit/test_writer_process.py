"""The audit writer process: killed, signalled, orphaned, and what it is given."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.channel import PROTOCOL, frame, log_call
from covenant.audit.errors import AuditUnavailable
from covenant.audit.reader import Entry, iter_records
from covenant.audit.verify import verify_log
from covenant.audit.writer import WRITER_COMMAND, AuditLog
from covenant.config import AuditConfig
from tests.processes import alive, wait_gone


def _records(directory: Path, type_: str) -> dict[int, dict]:
    return {e.seq: e.record["data"] for e in iter_records(directory) if isinstance(e, Entry) and e.type == type_}


async def test_a_killed_writer_fails_closed_and_a_new_one_takes_over(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    acked: dict[int, tuple[int, int]] = {}
    refused = 0
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        (first_writer,) = log.process_ids
        stop = False

        async def writer(w: int) -> None:
            nonlocal refused
            n = 0
            while not stop:
                try:
                    acked[await log.record("intent.received", {"w": w, "n": n})] = (w, n)
                except AuditUnavailable:
                    refused += 1
                    await trio.sleep(0.01)
                n += 1

        async def acked_at_least(count: int) -> None:
            with trio.fail_after(30):
                while len(acked) < count:
                    await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            for w in range(8):
                nursery.start_soon(writer, w)
            await acked_at_least(50)
            os.kill(first_writer, signal.SIGKILL)
            with trio.fail_after(30):
                while log.healthy:  # the reopen waits 1 s first: this cannot miss the failure
                    await trio.sleep(0.005)
                assert "writer process" in (log.failure or "")
                while not log.healthy:
                    await trio.sleep(0.05)
            await acked_at_least(len(acked) + 50)
            stop = True
        assert log.process_ids and log.process_ids[0] != first_writer
    assert not alive(first_writer)
    assert refused > 0
    present = _records(tmp_path, "intent.received")
    for seq, (w, n) in acked.items():
        assert present.get(seq) == {"w": w, "n": n}, f"acknowledged seq {seq} is missing or different"
    (resume,) = _records(tmp_path, "audit.resume").values()
    assert "writer process" in resume["error"] and resume["refused"] >= 1
    assert verify_log(tmp_path, key.public_key()).ok


async def test_sigterm_and_sigint_are_the_daemons_to_handle(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    """systemd signals the whole unit: the writer stays until the daemon has recorded its stop."""
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        (pid,) = log.process_ids
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            os.kill(pid, signum)
        await log.record("daemon.stop", {"pid": 1})
        assert log.healthy and log.process_ids == (pid,)
    assert list(_records(tmp_path, "daemon.stop").values()) == [{"pid": 1}]
    assert not alive(pid)
    assert verify_log(tmp_path, key.public_key()).ok


async def test_the_writer_gets_no_environment_and_no_key_in_its_arguments(
    tmp_path: Path, key: Ed25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-daemons-own")
    async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
        (pid,) = log.process_ids
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    names = {entry.split(b"=", 1)[0] for entry in environ.split(b"\0") if entry}
    assert names == {b"PATH", b"PYTHONPATH"}
    secret = key.private_bytes_raw().hex().encode()
    assert secret not in environ and secret not in cmdline and b"sk-the" not in environ


def _open_and_wait(directory: Path, key_bytes: bytes, pid_path: Path) -> None:
    async def main() -> None:
        async with AuditLog.open(directory, Ed25519PrivateKey.from_private_bytes(key_bytes), AuditConfig()) as log:
            await log.record("daemon.start", {"pid": os.getpid()})
            pid_path.write_text(str(log.process_ids[0]))
            await trio.sleep_forever()

    trio.run(main)


def test_the_writer_dies_with_its_daemon(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    pid_path = tmp_path / "writer.pid"
    daemon = multiprocessing.get_context("fork").Process(
        target=_open_and_wait, args=(tmp_path / "log", key.private_bytes_raw(), pid_path)
    )
    daemon.start()
    deadline = time.monotonic() + 30
    while not pid_path.exists() or not pid_path.read_text():
        assert time.monotonic() < deadline and daemon.is_alive()
        time.sleep(0.01)
    writer = int(pid_path.read_text())
    assert alive(writer)
    os.kill(daemon.pid, signal.SIGKILL)
    daemon.join()
    assert wait_gone(writer, 10), "the writer outlived its daemon"
    # Its lock went with it: the next daemon opens the log.

    async def reopen() -> None:
        async with AuditLog.open(tmp_path / "log", key, AuditConfig()) as log:
            assert log.healthy

    trio.run(reopen)
    assert verify_log(tmp_path / "log", key.public_key()).ok


async def test_the_writer_imports_nothing_from_the_daemons_working_directory(
    tmp_path: Path, key: Ed25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon started in a directory someone else can write must not run that someone's code with its key."""
    planted = tmp_path / "cwd" / "covenant"
    (planted / "audit").mkdir(parents=True)
    marker = tmp_path / "planted-code-ran"
    (planted / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (planted / "audit" / "__init__.py").write_text("")
    (planted / "audit" / "writer_process.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path / "cwd")
    async with AuditLog.open(tmp_path / "log", key, AuditConfig()) as log:
        await log.record("daemon.start", {"pid": 1})
    assert not marker.exists()
    assert verify_log(tmp_path / "log", key.public_key()).ok


async def test_a_writer_that_cannot_start_is_a_clear_error(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    broken = [sys.executable, "-c", "import sys; sys.exit(3)"]
    with pytest.raises(AuditUnavailable, match=r"cannot be opened \(the audit writer process exited at start \(status 3\)\)"):
        async with AuditLog.open(tmp_path, key, AuditConfig(), writer=broken):
            pass


async def test_records_larger_than_the_socket_buffer_arrive_whole_and_in_order(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    big = "x" * (3 * 1024 * 1024)  # far past a unix socket's buffer: the rest waits in the outbox
    events = [("intent.received", {"n": n, "text": big if n % 2 else "small"}) for n in range(6)]
    with trio.fail_after(60):
        async with AuditLog.open(tmp_path, key, AuditConfig()) as log:
            async with trio.open_nursery() as nursery:  # another caller's records meanwhile
                nursery.start_soon(log.record, "daemon.start", {"pid": 1})
                seqs = await log.record_many(events)
    assert seqs == sorted(seqs)
    present = _records(tmp_path, "intent.received")
    assert [present[seq] for seq in seqs] == [data for _, data in events]
    assert verify_log(tmp_path, key.public_key()).ok


def test_a_writer_of_another_protocol_refuses_to_write(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    """After an upgrade under a running daemon, a restarted writer must not misread the old daemon's frames."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        writer = subprocess.Popen(
            [*WRITER_COMMAND, str(theirs.fileno()), str(os.getpid())], pass_fds=(theirs.fileno(),)
        )
        theirs.close()
        hello = {"protocol": PROTOCOL + 1, "directory": str(tmp_path / "log"), "key": key.private_bytes_raw().hex()}
        ours.sendall(frame(json.dumps(hello).encode()))
        answer = json.loads(ours.makefile("rb").readline())
        assert writer.wait(30) == 1
    assert "protocol" in answer["error"]["message"] and "restart the daemon" in answer["error"]["message"]
    assert not (tmp_path / "log").exists()  # nothing was opened, locked or written


def test_a_log_message_from_the_writer_cannot_break_the_daemons_logging() -> None:
    """Fields that clash with LogRecord attributes (logging raises on those) are dropped; a foreign
    logger name and an unknown level fall back to covenant.audit and WARNING."""
    logger, level, text, extra = log_call(
        {"level": "LOUD", "logger": "root", "msg": "hello", "fields": {"msg": "x", "args": 1, "_p": 2, "path": "/p"}}
    )
    assert (logger.name, level, text, extra) == ("covenant.audit", logging.WARNING, "hello", {"path": "/p"})
    logger.log(level, text, extra={**extra, "writer_pid": 1})  # does not raise
    assert log_call("not a dict")[1:] == (logging.WARNING, "", {})
