"""``loop: test-driven`` through a real daemon, replica and scripted model: attempts run as the agent, recorded,
exported; adapters reach the provider; hostile code is bounded and leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat

import pytest

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply
from tests.rune.conftest import KEY_ENV, KEY_VALUE, add_rune_agent, outcome_of
from tests.rune.test_shell_exec import replica_pid, wait_none_left

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="attempts run as the agent's own uid")

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
FIELDS = {"session_id", "attempt", "generated_code", "stdout", "stderr", "exit_code", "tests_passed", "test_count",
          "tests_ran", "task_description", "task_type", "adapter_ids", "ts", "agent", "intent", "outcome"}
TESTS = (
    "import unittest\n"
    "class TestAdd(unittest.TestCase):\n"
    "    def test_add(self):\n"
    "        self.assertEqual(add(2, 3), 5)\n"
    "    def test_zero(self):\n"
    "        self.assertEqual(add(0, 0), 0)\n"
)
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
RIGHT = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n"


def start(d: DaemonProcess, fake: FakeModelServer, extra: str = "") -> None:
    provider = fake.provider_toml("fake", api_key_env=KEY_ENV, timeout_s=10)
    d.write_config(f"{extra}\n{provider}adapters = {{ \"add-v1\" = \"add-lora-model\" }}\n")
    d.env[KEY_ENV] = KEY_VALUE
    package = add_rune_agent(d, "coder", toolset=())
    with open(package / "Runefile", "a") as runefile:
        runefile.write("loop: test-driven\n")
    d.start()


def task(attempts: int, adapters: list[str] | None = None, tests: str = TESTS) -> str:
    return json.dumps({"task_description": "Write add(a, b) returning the sum", "test_suite": tests,
                       "task_type": "function", "max_attempts": attempts, "adapter_ids": adapters or []})


def dispatch(d: DaemonProcess, text: str) -> tuple[int, dict]:
    result = d.cli("dispatch", text, "--agent", "coder@local", "--json")
    return result.returncode, outcome_of(result)


def exported(d: DaemonProcess) -> list[dict]:
    result = d.cli("sessions", "export", "--trajectories", "--jsonl", "--agent", "coder")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_retries_until_the_tests_pass_then_exhausts_and_exports(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    start(daemon, fake_model)
    fake_model.script(Reply(text=WRONG), Reply(text=RIGHT))
    code, outcome = dispatch(daemon, task(3, ["add-v1"]))
    assert code == 0 and outcome["outcome"] == "ok", outcome
    assert outcome["text"].strip() == "def add(a, b):\n    return a + b"
    first, second = fake_model.requests
    assert first.body["model"] == second.body["model"] == "add-lora-model", "the adapter did not reach the provider"
    feedback = second.messages[-1]["content"]
    assert "return a - b" in feedback and "AssertionError" in feedback and "FAILED" in feedback, feedback

    folder = daemon.home / "state" / "trajectories" / "coder@local"
    (path,) = folder.iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.geteuid()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    one, two = exported(daemon)
    for record in (one, two):
        assert set(record) == FIELDS, set(record) ^ FIELDS
        assert UUID4.match(record["session_id"]) and record["session_id"] == path.stem
        assert record["intent"] == outcome["intent_id"] and record["adapter_ids"] == ["add-v1"]
        assert record["task_type"] == "function" and record["outcome"] == "success"
        assert record["test_count"] == 2 and record["tests_ran"] is True
    assert (one["attempt"], one["tests_passed"], one["exit_code"]) == (1, False, 1)
    assert "return a - b" in one["generated_code"] and "FAILED (failures=1)" in one["stderr"]
    assert (two["attempt"], two["tests_passed"], two["exit_code"]) == (2, True, 0)
    assert "Ran 2 tests" in two["stderr"] and one["session_id"] == two["session_id"]

    # Never passing: tests_exhausted, exit 4, every attempt kept; the JSON list form holds the same records.
    fake_model.script(Reply(text=WRONG), Reply(text="no code at all"))
    code, outcome = dispatch(daemon, task(2))
    assert code == 4 and outcome["outcome"] == "tests_exhausted", outcome
    assert len(fake_model.requests) == 4 and fake_model.requests[2].body["model"] == "fake-model"
    records = exported(daemon)
    assert len(records) == 4
    assert [(r["attempt"], r["tests_passed"], r["outcome"]) for r in records[2:]] == [(1, False, "exhausted"),
                                                                                      (2, False, "exhausted")]
    assert records[3]["generated_code"] == "no code at all" and records[3]["exit_code"] != 0
    listed = daemon.cli("sessions", "export", "--trajectories")
    assert listed.returncode == 0 and json.loads(listed.stdout) == records

    # Input that is no task, and an adapter no provider serves: refused, the model never asked, nothing recorded.
    for text, want_code, want in (("write me a sort", 1, "agent_error"),
                                  (json.dumps({"task_description": "x", "test_suite": TESTS, "max_attempts": 99}), 1, "agent_error"),
                                  (task(1, ["nobody-serves-this"]), 4, "provider_error")):
        code, outcome = dispatch(daemon, text)
        assert (code, outcome["outcome"]) == (want_code, want), outcome
    assert "nobody-serves-this" in outcome["error"] and "adapters" in outcome["error"]
    assert len(fake_model.requests) == 4 and len(exported(daemon)) == 4
    assert daemon.cli("sessions", "export").returncode == 2  # export names what it exports
    assert daemon.stop() == 0


def test_hostile_code_is_bounded_and_leaves_no_process(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    start(daemon, fake_model, extra="[tools.shell_exec]\ntimeout_ms = 3000\n")
    escape = daemon.home / f"escaped-{secrets.token_hex(4)}"
    forever = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    forks = ("```python\nimport os, subprocess\n"
             "for _ in range(3):\n    subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
             "def add(a, b):\n    return a - b\n```")
    writes = f"```python\nopen({str(escape)!r}, 'w').write('x')\ndef add(a, b):\n    return a + b\n```"
    fake_model.script(Reply(text=forever), Reply(text=forks), Reply(text=writes))
    code, outcome = dispatch(daemon, task(3))
    assert code == 4 and outcome["outcome"] == "tests_exhausted", outcome
    looped, forked, wrote = exported(daemon)
    assert not any(r["tests_passed"] for r in (looped, forked, wrote))
    assert "timeout" in looped["stderr"] and looped["tests_ran"] is False
    assert forked["test_count"] == 2 and forked["exit_code"] == 1
    assert "PermissionError" in wrote["stderr"] and wrote["tests_ran"] is False
    assert not escape.exists()
    uid = (daemon.home / "state" / "workspaces" / "coder@local").stat().st_uid
    assert uid != 0
    wait_none_left(uid, replica_pid(daemon))
    assert daemon.stop() == 0
