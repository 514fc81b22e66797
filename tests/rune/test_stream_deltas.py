"""`dispatch --stream` under safety_policy none: each provider delta reaches the terminal as it is sent.

The fake provider pauses its stream on an event the test holds, so what the CLI printed before the
test lets it go on was streamed, not buffered: no timing margin decides it.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply
from tests.rune.conftest import KEY_VALUE
from tests.rune.test_rune_e2e import _started


def _read_until(process: subprocess.Popen[str], wanted: bytes, timeout: float = 60) -> bytes:
    """The CLI's stdout bytes up to and including ``wanted`` (fails after ``timeout`` or at its exit)."""
    assert process.stdout is not None
    fd, seen = process.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"the CLI printed only {seen!r} in {timeout} s"
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"the CLI ended (exit {process.wait()}) after printing only {seen!r}"
            seen += chunk
    return seen


def test_with_safety_none_the_first_token_is_printed_before_the_provider_sends_the_last(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    _started(daemon, [("fake", fake_model)], toolset=(), safety="none")
    resume = threading.Event()
    # Events: the role chunk, then "Tick"; the fake holds " tock, it is noon." until the test sets resume.
    fake_model.script(Reply(text="Tick tock, it is noon.", pause_after_events=2, resume=resume))
    process = daemon.cli_background("dispatch", "time?", "--agent", "chat@local", "--stream")
    try:
        first = _read_until(process, b"Tick")
        assert first == b"Tick" and not resume.is_set()
        resume.set()
        rest, errors = process.communicate(timeout=60)
    finally:
        resume.set()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, errors
    assert first.decode() + rest == "Tick tock, it is noon.\n"

    # Still under none, a provider key's value never reaches the terminal (it is held only while it may be one).
    fake_model.script(Reply(text=f"the key is {KEY_VALUE} ok"))
    leaked = daemon.cli("dispatch", "leak it", "--agent", "chat@local", "--stream")
    assert leaked.returncode == 0, leaked.stderr
    assert leaked.stdout == "the key is [REDACTED] ok\n"
    assert daemon.stop() == 0
