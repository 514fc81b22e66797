"""Hostile: faults that used to lose a Rune agent's record or its replica's supervision, against one real root
daemon with a scripted model (issue 35, items 4 and 8).

A ``shell-exec`` command leaves 1,500 levels of directories in its HOME and its uid's private /tmp, which
the replica's restart and the daemon's shutdown then remove; the provider answers with a lone surrogate; a
session file is cut back by one record. Every dispatch keeps its record and completion, the replica keeps
serving, the audit log verifies, and nothing of the agent outlives the daemon.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

from tests.daemon.conftest import DaemonProcess, daemon_home
from tests.daemon.test_daemon_e2e import wait_for
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of
from tests.rune.test_file_tools import tool_results
from tests.security.conftest import processes_of_uid

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="agents run as uids of their own only under a root daemon"),
              pytest.mark.xdist_group("fault-records-rune")]  # one worker: the module's daemon is started once

LEVELS = 1500
TREE = f"$(printf 'd/%.0s' $(seq {LEVELS}))"
DEEP = (f'cd "$HOME" && mkdir -p {TREE} && echo home-made; '
        f"cd /tmp 2>/dev/null && mkdir -p {TREE} 2>/dev/null && echo tmp-made; true")
"""A shell command that leaves a tree deeper than Python's recursion limit in its HOME and, where a tool may
write there (a tool without the ``filesystem`` capability may not, issue 35 item 3), in its uid's /tmp."""


@dataclass
class Hosted:
    daemon: DaemonProcess
    fake: FakeModelServer

    def dispatch(self, text: str, *extra: str) -> tuple[int, dict]:
        done = self.daemon.cli("dispatch", text, "--agent", "chat@local", "--json", *extra, timeout=180)
        return done.returncode, outcome_of(done)

    def replica(self) -> dict:
        (replica,) = self.daemon.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
        return replica

    def events(self, intent: str) -> list[str]:
        lines = self.daemon.cli("audit", "tail", "--json", "-n", "1000000", check=True).stdout.splitlines()
        return [r["type"] for r in map(json.loads, lines) if r["data"].get("intent") == intent]

    def shell(self, command: str) -> dict:
        """Dispatch one shell-exec of ``command``; its result as the model got it."""
        self.fake.script(Reply.tools(ToolCall("shell-exec", {"command": command, "timeout_ms": 60_000})),
                         Reply(text="done"))
        code, outcome = self.dispatch("run it")
        assert code == 0 and outcome["outcome"] == "ok", outcome
        assert self.events(outcome["intent_id"]).count("intent.completed") == 1
        replica = self.replica()["pid"]
        assert [pid for pid in processes_of_uid(psutil.Process(replica).uids().real) if pid != replica] == []
        return tool_results(self.fake, len(self.fake.requests) - 1)[-1]


def plant_deep_tree(pid: int, levels: int = LEVELS, name: str = "d") -> None:
    """What an agent process may leave in its uid's private /tmp, put there from the host through the replica's
    view of it (``/proc/<pid>/root/tmp``), owned by the agent's uid: whether a tool may write /tmp itself
    depends on its capabilities, the daemon's cleanup must hold either way."""
    uid = psutil.Process(pid).uids().real
    fd = os.open(f"/proc/{pid}/root/tmp", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.fchown(child, uid, uid)
        os.close(fd)
        fd = child
    os.close(fd)


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosted]:
    with daemon_home(tmp_path_factory.mktemp("rune-faults")) as d, FakeModelServer() as fake:
        configure(d, ("fake", fake))
        add_rune_agent(d, toolset=("rune@shell-exec",), max_steps=8)
        d.start()
        d.cli("grant", "tester@test", "tool.shell_exec", check=True)
        yield Hosted(d, fake)
        # The last test left a deep tree in the uid's /tmp: the shutdown removes it with the replica.
        assert d.stop() == 0, d.log()[-3000:]
        assert "Traceback" not in d.log(), d.log()[-3000:]
        assert d.cli("audit", "verify").returncode == 0
        low, high = d.uid_range
        left = [p.pid for p in psutil.process_iter(["uids"]) if low <= p.info["uids"].real <= high]
        assert left == [], f"processes of the home's agent uids outlived the daemon: {left}"


def test_a_deep_tree_from_shell_exec_keeps_its_result_and_survives_a_replica_restart(hosted: Hosted) -> None:
    made = hosted.shell(DEEP)
    assert "home-made" in made["stdout"], made  # removed with the tool run's scratch dir, its result kept
    before = hosted.replica()
    plant_deep_tree(before["pid"])
    assert "d" in os.listdir(f"/proc/{before['pid']}/root/tmp")
    hosted.daemon.api("POST", "/v1/replicas/chat@local/restart")
    wait_for(lambda: hosted.replica()["state"] == "ready" and hosted.replica()["pid"] != before["pid"],
             what="the replica restarted")
    looked = hosted.shell('ls -A /tmp; echo "--"; ls -A "$HOME"')
    tmp, home = looked["stdout"].split("--\n")
    assert "d" not in tmp.split() and home.split() == [], looked  # the restart emptied its /tmp; HOME is fresh
    assert "d" not in os.listdir(f"/proc/{hosted.replica()['pid']}/root/tmp")
    assert "Traceback" not in hosted.daemon.log() and "could not" not in hosted.daemon.log()


def test_a_provider_answer_with_a_lone_surrogate_keeps_the_replica_serving(hosted: Hosted) -> None:
    answer = {"id": "c1", "object": "chat.completion", "model": "fake-model",
              "choices": [{"index": 0, "finish_reason": "stop",
                           "message": {"role": "assistant", "content": "PLACEHOLDER"}}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    raw = json.dumps(answer).replace("PLACEHOLDER", "half \\ud800 a pair").encode()
    hosted.fake.script(Reply(raw_body=raw), Reply(text="still serving"))
    code, outcome = hosted.dispatch("say something broken")
    assert code == 0 and outcome["outcome"] == "ok" and outcome["text"] == "half \ufffd a pair", outcome
    assert hosted.events(outcome["intent_id"]).count("intent.completed") == 1
    pid = hosted.replica()["pid"]
    code, again = hosted.dispatch("and again")
    assert code == 0 and again["text"] == "still serving", again
    assert hosted.replica()["pid"] == pid and hosted.replica()["state"] == "ready"


def test_a_session_file_cut_back_by_one_record_is_refused_truncated(hosted: Hosted) -> None:
    hosted.fake.script(Reply(text="noted"), Reply(text="noted again"))
    for text in ("my name is Ada", "and I like tea"):
        code, outcome = hosted.dispatch(text, "--session", "cut")
        assert code == 0 and outcome["outcome"] == "ok", outcome
    path = hosted.daemon.home / "state" / "sessions" / "chat@local" / "cut.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))  # sed -i '$d'
    asked = len(hosted.fake.requests)
    code, outcome = hosted.dispatch("who am I?", "--session", "cut")
    assert code == 4 and outcome["outcome"] == "session_corrupt", outcome
    assert "(truncated)" in outcome["error"], outcome["error"]
    assert len(hosted.fake.requests) == asked  # no model was asked
    assert hosted.events(outcome["intent_id"]).count("intent.completed") == 1
    assert "reason=truncated" in hosted.daemon.log()
    verify = hosted.daemon.cli("sessions", "verify", "chat@local", "cut")
    assert verify.returncode == 1 and "(truncated)" in verify.stdout, verify.stdout


def test_a_deep_tree_left_in_tmp_at_shutdown(hosted: Hosted) -> None:
    """Left for the fixture's shutdown: it must remove the tree and stop cleanly (exit 0, nothing left)."""
    made = hosted.shell(DEEP.replace("d/", "e/"))
    assert "home-made" in made["stdout"], made
    plant_deep_tree(hosted.replica()["pid"], name="e")
