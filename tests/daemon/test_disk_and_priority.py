"""``disk_mb`` holds a dispatch's whole disk use, and ``dispatch --priority`` sets the agent's nice: a real daemon,
real python3 agents, the real CLI (issue 39 items 7 and 8)."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.daemon.conftest import TEST_AGENTS, DaemonProcess
from tests.runtime.conftest import leftovers

DISK_MB = 5


def _add_disk_user(daemon: DaemonProcess) -> Path:
    folder = daemon.home / "agents" / "disk"
    folder.mkdir(parents=True)
    shutil.copy(TEST_AGENTS / "disk_user.py", folder / "disk_user.py")
    os.chmod(folder / "disk_user.py", 0o644)
    (folder / "agent.toml").write_text(textwrap.dedent(f"""\
        [agent]
        id = "disk@local"
        name = "disk"
        version = "0.1.0"
        runtime = "python3"
        entry = "disk_user.py"

        [resources]
        cpu_ms_per_task = 60000
        memory_mb = 256
        disk_mb = {DISK_MB}
        network = "off"
        """))
    return folder


def _dispatch(daemon: DaemonProcess, text: str, *options: str) -> tuple[int, dict]:
    done = daemon.cli("dispatch", text, "--agent", "disk", "--json", *options, timeout=180)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def _home_of(outcome: dict) -> str:
    """The agent's HOME (its scratch dir), from the first line it wrote on stderr."""
    first = outcome["record"]["stderr_tail"].splitlines()[0]
    assert first.startswith("home /"), outcome["record"]["stderr_tail"]
    return first.removeprefix("home ")


def _assert_over_and_cleaned(daemon: DaemonProcess, code: int, outcome: dict) -> None:
    """Exit 4, outcome disk_exceeded, its record stored and shown, nothing of it running, its scratch dir emptied
    (removed, or kept empty for the uid's next run)."""
    assert code == 4 and outcome["outcome"] == "disk_exceeded", outcome
    assert f"disk_mb = {DISK_MB}" in outcome["error"], outcome["error"]
    intent = outcome["intent_id"]
    shown = json.loads(daemon.cli("show", intent, "--json", check=True).stdout)
    assert shown["outcome"] == "disk_exceeded" and shown["limits"]["disk_mb"] == DISK_MB
    assert leftovers(intent) == []
    home = _home_of(outcome)
    assert not os.path.exists(home) or os.listdir(home) == []


def test_disk_mb_caps_the_whole_scratch_use_and_priority_sets_the_agents_nice(daemon: DaemonProcess) -> None:
    _add_disk_user(daemon)
    daemon.start()

    # 40 files of 1 MiB, each under RLIMIT_FSIZE: their sum is over disk_mb. A tick may stop the agent while it
    # writes; if it ends first, the last measurement, taken before its files are removed, decides.
    code, outcome = _dispatch(daemon, "files 40")
    _assert_over_and_cleaned(daemon, code, outcome)
    assert outcome["record"]["scratch_peak_bytes"] > DISK_MB * 2**20
    assert outcome["record"]["result"] is None  # an answer after a crossed limit is not kept as the result

    # The same, then the agent waits: only the sampler ends it, long before its 60 s budget.
    code, outcome = _dispatch(daemon, "hold 40")
    _assert_over_and_cleaned(daemon, code, outcome)
    assert outcome["record"]["duration_ms"] < 30_000, outcome["record"]

    # Under the limit: ok, and its files are removed all the same.
    code, outcome = _dispatch(daemon, "files 3")
    assert code == 0 and outcome["outcome"] == "ok", outcome
    assert outcome["record"]["scratch_peak_bytes"] == 3 * 2**20
    assert not os.path.exists(_home_of(outcome))

    # Many empty files take no block: more entries than disk_mb allows (256 per MiB) is over it all the same.
    code, outcome = _dispatch(daemon, "tiny 2000")
    _assert_over_and_cleaned(daemon, code, outcome)
    assert f"over the {DISK_MB * 256} that disk_mb = {DISK_MB} allows" in outcome["error"], outcome["error"]

    # Links to the whole host and to a big file, 200 levels, a directory closed to its owner: measured, never
    # followed, 2 MiB in all: ok, and all of it removed.
    code, outcome = _dispatch(daemon, "odd")
    if os.geteuid() == 0:
        assert code == 0 and outcome["outcome"] == "ok", outcome
        assert outcome["record"]["scratch_peak_bytes"] == 2 * 2**20, outcome["record"]
    else:  # a same-uid daemon may not list what the agent closed: not measured, not trusted
        _assert_over_and_cleaned(daemon, code, outcome)
        assert "cannot measure" in outcome["error"] and "cannot list it" in outcome["error"], outcome["error"]
    assert outcome["record"]["cleanup"]["complete"] and not os.path.exists(_home_of(outcome))

    # Priority: low raises the nice, high lowers it where the daemon may (root); normal keeps the daemon's own
    # (this test's, which it inherits) as the manifest's [settlement] priority is normal.
    own = os.getpriority(os.PRIO_PROCESS, 0)
    expected = {"low": 10, "normal": own, "high": -5 if os.geteuid() == 0 else own}
    for priority, nice in expected.items():
        code, outcome = _dispatch(daemon, "nice", "--priority", priority)
        assert code == 0 and outcome["text"] == str(nice), (priority, outcome)
        limits = outcome["record"]["limits"]
        assert limits["priority"] == priority and limits["nice"] == nice, limits
    spawned = [json.loads(line)["data"] for line in daemon.cli(
        "audit", "tail", "--json", "-n", "1000000", "--type", "agent.spawned", check=True).stdout.splitlines()]
    assert [s["limits"]["nice"] for s in spawned[-3:]] == list(expected.values())

    # covenant run, no daemon: the same outcome and exit code.
    ran = daemon.cli("run", str(daemon.home / "agents" / "disk"), "files 40", "--json", timeout=180)
    assert ran.returncode == 4 and json.loads(ran.stdout)["outcome"] == "disk_exceeded", ran.stdout + ran.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="a private /tmp per agent uid needs a root daemon")
def test_filling_the_private_tmp_ends_disk_exceeded_and_tmp_is_emptied(daemon: DaemonProcess) -> None:
    _add_disk_user(daemon)
    daemon.start()
    code, outcome = _dispatch(daemon, "tmp")
    _assert_over_and_cleaned(daemon, code, outcome)
    record = outcome["record"]
    assert record["isolation"] == "uid" and "filled its private /tmp" in outcome["error"], outcome
    stopped = [line for line in record["stderr_tail"].splitlines() if line.startswith("stopped after")]
    assert stopped and stopped[0].endswith("No space left on device"), record["stderr_tail"]  # the kernel's cap
    assert record["scratch_peak_bytes"] >= (DISK_MB - 1) * 2**20
    # The uid's next run finds its /tmp emptied: it gets exactly as far again.
    code, again = _dispatch(daemon, "tmp")
    _assert_over_and_cleaned(daemon, code, again)
    assert stopped[0] in again["record"]["stderr_tail"], again["record"]["stderr_tail"]
    code, outcome = _dispatch(daemon, "files 1")
    assert code == 0 and outcome["outcome"] == "ok", outcome
