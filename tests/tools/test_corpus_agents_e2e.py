"""The corpus's code-assistant and memory-agent, unchanged, end to end (issue 14's acceptance).

A real daemon and replica, the scripted fake model in place of the providers the packages name,
the real built-ins: files in the agent's workspace, a shell command as the agent's uid, memory kept
by the daemon across dispatches.
"""

from __future__ import annotations

import json
import os
import shutil

from tests.conftest import rune_examples
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import configure, outcome_of


def _install(daemon: DaemonProcess, package: str) -> None:
    target = daemon.home / "agents" / package
    shutil.copytree(rune_examples() / package, target)
    for folder, _, files in os.walk(target):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


def _tool_answer(fake_model: FakeModelServer, request: int) -> dict:
    """The last tool result the model was given in its ``request``-th request."""
    return json.loads([m for m in fake_model.requests[request].messages if m["role"] == "tool"][-1]["content"])


def test_code_assistant_writes_patches_and_runs_code_in_its_workspace(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    _install(daemon, "code-assistant")
    configure(daemon, ("openai", fake_model))  # anthropic, listed first, is not configured: skipped
    daemon.start()
    # Every toolset entry is a required capability of the agent: the issuer must hold them all.
    daemon.cli("grant", "tester@test", "tool.file_read", "tool.file_write", "tool.file_list", "tool.apply_patch",
               "tool.shell_exec", "tool.memory_store", "tool.memory_recall", check=True)
    patch = "--- a/hello.py\n+++ b/hello.py\n@@ -1 +1 @@\n-print('hi')\n+print('hello from the workspace')\n"
    fake_model.script(
        Reply.tools(ToolCall("file-write", {"path": "hello.py", "content": "print('hi')\n"})),
        Reply.tools(ToolCall("apply-patch", {"patch": patch})),
        Reply.tools(ToolCall("shell-exec", {"command": "python3 hello.py; id -u"})),
        Reply.tools(ToolCall("file-read", {"path": "../../../identity/daemon.key"})),
        Reply(text="Patched and ran hello.py."),
    )
    result = daemon.cli("dispatch", "write and run a hello script", "--agent", "code-assistant@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["outcome"] == "ok", outcome
    assert outcome["text"] == "Patched and ran hello.py."
    assert {"file-write", "apply-patch", "shell-exec", "file-read"} <= set(fake_model.requests[0].tool_names)

    assert _tool_answer(fake_model, 1)["created"] is True
    assert _tool_answer(fake_model, 2)["files"][0]["action"] == "modified"
    ran = _tool_answer(fake_model, 3)
    output = ran["stdout"].splitlines()
    assert ran["exit_code"] == 0 and output[0] == "hello from the workspace", ran
    assert int(output[1]) != 0  # the shell ran as the agent's uid, never root
    refused = _tool_answer(fake_model, 4)
    assert refused["error"]["code"] == "path_refused"

    workspace = daemon.home / "state" / "workspaces" / "code-assistant@local"
    script = workspace / "hello.py"
    assert script.read_text() == "print('hello from the workspace')\n"
    assert os.stat(script).st_uid == int(output[1]) == os.stat(workspace).st_uid
    assert daemon.stop() == 0


def test_memory_agent_remembers_a_name_across_dispatches(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    _install(daemon, "memory-agent")
    configure(daemon, ("openai", fake_model))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.memory_list", "tool.memory_store", "tool.memory_recall", check=True)
    fake_model.script(
        Reply.tools(ToolCall("memory-list", {})),
        Reply.tools(ToolCall("memory-store", {"key": "user_name", "value": "Ada"})),
        Reply(text="Nice to meet you, Ada. I'll remember that."),
    )
    first = outcome_of(daemon.cli("dispatch", "Hi, I'm Ada", "--agent", "memory-agent@local", "--json"))
    assert first["outcome"] == "ok", first
    assert _tool_answer(fake_model, 1)["keys"] == []  # nothing known yet

    fake_model.script(
        Reply.tools(ToolCall("memory-list", {}), ToolCall("memory-recall", {"key": "user_name"})),
        Reply(text="Welcome back, Ada."),
    )
    second = outcome_of(daemon.cli("dispatch", "hello again", "--agent", "memory-agent@local", "--json"))
    assert second["outcome"] == "ok" and second["text"] == "Welcome back, Ada.", second
    answers = [json.loads(m["content"]) for m in fake_model.requests[-1].messages if m["role"] == "tool"]
    assert any(a.get("keys") == ["user_name"] for a in answers), answers
    assert any(a.get("found") is True and a.get("value") == "Ada" for a in answers), answers
    assert daemon.stop() == 0
