"""A replica outlives the thread pool's idle retirement (PR_SET_PDEATHSIG is per spawning thread)."""

from __future__ import annotations

import time

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply
from tests.rune.conftest import add_rune_agent, configure, outcome_of

TRIO_THREAD_IDLE_S = 10
"""trio's thread cache retires a worker idle this long; a replica launched from one died with it."""


def test_an_idle_replica_is_not_killed_when_a_worker_thread_retires(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model), extra='[rune]\nstart = "eager"\n')
    add_rune_agent(daemon, toolset=())
    daemon.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        replicas = daemon.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
        if replicas and replicas[0]["state"] == "ready":
            break
        time.sleep(0.2)
    (before,) = daemon.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
    assert before["state"] == "ready", before
    time.sleep(TRIO_THREAD_IDLE_S + 3)
    (after,) = daemon.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
    assert after["pid"] == before["pid"] and after["restarts"] == 0, after
    fake_model.script(Reply(text="still here"))
    result = daemon.cli("dispatch", "hello", "--agent", "chat@local", "--json")
    assert outcome_of(result)["text"] == "still here"
    assert daemon.stop() == 0
