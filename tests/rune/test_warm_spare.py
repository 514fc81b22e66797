"""``[rune] warm = 1``: a spare replica process waits beside the running one and becomes the next one.

Asserted by pids and process start times, never by how long a start took: the replica serving after a
restart is the process that was already waiting before the restart was asked for.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply
from tests.processes import alive, wait_gone
from tests.rune.conftest import add_rune_agent, configure, outcome_of
from tests.rune.test_rune_ops import replicas, wait_for


def _started_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def _uptime_ticks() -> int:
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def _real_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def _spare_beside(d: DaemonProcess, *not_these: int) -> int:
    """Wait for the agent's ready replica to have a spare other than ``not_these``; its pid."""
    wait_for(lambda: (r := replicas(d)[0])["state"] == "ready" and r["spare_pid"] not in (None, *not_these),
             what="a warm spare beside the ready replica")
    return int(replicas(d)[0]["spare_pid"])


def _ask(d: DaemonProcess, fake: FakeModelServer, text: str) -> None:
    fake.script(Reply(text=text))
    assert outcome_of(d.cli("dispatch", "hi", "--agent", "chat@local", "--json"))["text"] == text


def test_the_warm_spare_serves_the_first_dispatch_after_a_restart_or_reload_and_a_dead_one_is_replaced(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    configure(daemon, ("fake", fake_model), extra="[rune]\nwarm = 1\n")
    folder = add_rune_agent(daemon, toolset=())
    daemon.start()
    _ask(daemon, fake_model, "one")
    first = replicas(daemon)[0]["pid"]
    spare = _spare_beside(daemon)
    assert spare != first and _real_uid(spare) == _real_uid(first)  # launched as the agent, like the replica
    assert f"pid {first}, 0 in flight, 0 restarts, warm spare pid {spare}" in daemon.cli("status", check=True).stdout

    asked_at = _uptime_ticks()
    daemon.cli("restart", "chat", check=True)
    wait_for(lambda: replicas(daemon)[0]["state"] == "ready", what="the replica after the restart")
    assert replicas(daemon)[0]["pid"] == spare, "the restart did not take the spare over"
    assert _started_ticks(spare) <= asked_at, "the replica after the restart was not started before it"
    assert wait_gone(first, 30)
    _ask(daemon, fake_model, "two")
    assert replicas(daemon)[0]["pid"] == spare

    # A spare that dies while it waits is dropped; the next start is a cold one, and a new spare follows it.
    second_spare = _spare_beside(daemon, spare)
    os.kill(second_spare, signal.SIGKILL)
    wait_for(lambda: replicas(daemon)[0]["spare_pid"] != second_spare, what="the dead spare dropped")
    daemon.cli("restart", "chat", check=True)
    wait_for(lambda: replicas(daemon)[0]["state"] == "ready", what="a cold replica after the restart")
    cold = replicas(daemon)[0]["pid"]
    assert cold not in (spare, second_spare)
    _ask(daemon, fake_model, "three")
    third_spare = _spare_beside(daemon, spare, second_spare)

    # A reload that changed the package: the spare becomes the new replica, and it was told the new instructions.
    runefile = folder / "Runefile"
    runefile.write_text(runefile.read_text().replace("covenant test agent.", "covenant test agent, version two."))
    asked_at = _uptime_ticks()
    daemon.cli("reload", check=True)
    wait_for(lambda: (r := replicas(daemon)[0])["pid"] not in (cold, None) and r["state"] == "ready",
             what="the replica after the reload")
    assert replicas(daemon)[0]["pid"] == third_spare and _started_ticks(third_spare) <= asked_at
    _ask(daemon, fake_model, "four")
    assert "version two" in fake_model.requests[-1].messages[0]["content"]

    assert daemon.stop() == 0
    for pid in (first, spare, second_spare, cold, third_spare):
        assert not alive(pid), f"pid {pid} outlived the daemon"


def test_without_warm_a_restart_starts_a_new_process(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, toolset=())
    daemon.start()
    _ask(daemon, fake_model, "one")
    first = replicas(daemon)[0]["pid"]
    asked_at = _uptime_ticks()
    daemon.cli("restart", "chat", check=True)
    wait_for(lambda: replicas(daemon)[0]["state"] == "ready", what="the replica after the restart")
    (after,) = replicas(daemon)
    assert after["pid"] != first and after["spare_pid"] is None
    assert _started_ticks(after["pid"]) >= asked_at, "a process started before the restart served after it"
    assert daemon.stop() == 0
    assert not alive(after["pid"])


def test_an_idle_stop_takes_the_spare_with_the_replica(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model), extra="[rune]\nwarm = 1\nidle_stop_s = 5\n")  # the spare is up long before
    add_rune_agent(daemon, toolset=())
    daemon.start()
    _ask(daemon, fake_model, "one")
    replica = replicas(daemon)[0]["pid"]
    spare = _spare_beside(daemon)
    wait_for(lambda: replicas(daemon)[0]["state"] == "stopped", what="the idle stop")
    assert replicas(daemon)[0]["spare_pid"] is None
    assert wait_gone(replica, 30) and wait_gone(spare, 30), "the idle stop left a process of the agent running"
    _ask(daemon, fake_model, "two")  # started again (cold) at the next dispatch
    assert replicas(daemon)[0]["pid"] not in (replica, spare)
    assert daemon.stop() == 0
