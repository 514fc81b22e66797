"""The file tools' escape corpus through a real daemon, a real replica and the scripted fake model.

Every refused call must be one ``tool.call`` event with outcome ``denied``
(``path_refused``) and an error result in the model's next request; the
daemon's own files are never read or changed.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of

FILE_TOOLS = ("rune@file-read", "rune@file-write", "rune@file-list", "rune@apply-patch")
SECRET = "daemon secret, never for agents\n"


def tool_results(fake: FakeModelServer, request: int) -> list[dict]:
    """The tool messages of the model request number ``request``, decoded."""
    return [json.loads(m["content"]) for m in fake.requests[request].messages if m["role"] == "tool"]


def tool_events(d: DaemonProcess, intent: str) -> list[dict]:
    lines = d.cli("audit", "tail", "--json", "-n", "1000000", "--type", "tool.call", check=True).stdout.splitlines()
    return [r["data"] for r in map(json.loads, lines) if r["data"]["intent"] == intent]


def start(d: DaemonProcess, fake: FakeModelServer, max_steps: int = 4) -> Path:
    configure(d, ("fake", fake))
    add_rune_agent(d, toolset=FILE_TOOLS, max_steps=max_steps)
    d.start()
    d.cli("grant", "tester@test", "tool.file_read", "tool.file_write", "tool.file_list", "tool.apply_patch", check=True)
    return d.home / "state" / "workspaces" / "chat@local"


def dispatch(d: DaemonProcess, text: str = "work") -> dict:
    result = d.cli("dispatch", text, "--agent", "chat@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["outcome"] == "ok", outcome
    return outcome


def test_the_escape_corpus_is_refused_and_audited(daemon: DaemonProcess, fake_model: FakeModelServer, tmp_path: Path) -> None:
    workspace = start(daemon, fake_model)
    fake_model.script(Reply.tools(ToolCall("file-write", {"path": "notes/a.txt", "content": "mine"})), Reply(text="ok"))
    dispatch(daemon)
    uid = workspace.stat().st_uid
    written = workspace / "notes" / "a.txt"
    assert written.read_text() == "mine" and written.stat().st_uid == uid
    if os.geteuid() == 0:
        assert uid != 0, "the workspace must be the agent's uid, not root's"

    secret_dir = tmp_path / "daemon-only"
    secret_dir.mkdir(mode=0o700)
    secret = secret_dir / "secret"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    links = {"out": str(secret_dir), "proc": "/proc/self/root", "up": "../../.."}
    for name, target in links.items():
        os.symlink(target, workspace / name)
        os.lchown(workspace / name, uid, uid)
    os.link(secret, workspace / "hard")  # as the agent could have, where protected_hardlinks is off
    attempts = [
        ToolCall("file-read", {"path": "../../../covenant.toml"}),
        ToolCall("file-read", {"path": str(secret)}),
        ToolCall("file-read", {"path": "out/secret"}),
        ToolCall("file-read", {"path": "hard"}),
        ToolCall("file-read", {"path": "proc/etc/shadow"}),
        ToolCall("file-read", {"path": "/proc/self/root/etc/shadow"}),
        ToolCall("file-list", {"path": "up"}),
        ToolCall("file-write", {"path": "hard", "content": "pwned"}),
        ToolCall("file-write", {"path": "out/new", "content": "pwned"}),
        ToolCall("apply-patch", {"patch": "--- a/hard\n+++ b/hard\n@@ -1 +1 @@\n-" + SECRET + "+pwned\n"}),
    ]
    fake_model.script(Reply.tools(*attempts), Reply(text="could not"))
    outcome = dispatch(daemon, "steal")
    results = tool_results(fake_model, 3)
    assert len(results) == len(attempts)
    assert [r["error"]["code"] for r in results] == ["path_refused"] * len(attempts), results
    assert all(SECRET.strip() not in json.dumps(r) for r in results)
    events = tool_events(daemon, outcome["intent_id"])
    assert [(e["outcome"], e["error_code"]) for e in events] == [("denied", "path_refused")] * len(attempts)
    assert secret.read_text() == SECRET and not (secret_dir / "new").exists()
    assert daemon.stop() == 0


def test_a_symlink_swapped_in_between_check_and_use_never_escapes(
    daemon: DaemonProcess, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    workspace = start(daemon, fake_model, max_steps=12)
    fake_model.script(Reply.tools(ToolCall("file-write", {"path": "real/f", "content": "inside"})), Reply(text="ok"))
    dispatch(daemon)
    uid = workspace.stat().st_uid
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (outside / "f").write_text(SECRET)
    stop = threading.Event()

    def flip() -> None:  # the agent's move, made as fast as a thread can
        d, real, tmp_link = workspace / "d", workspace / "real", workspace / "d.link"
        while not stop.is_set():
            try:
                os.symlink(str(outside), tmp_link)
                os.lchown(tmp_link, uid, uid)
                os.rename(tmp_link, d)
                os.unlink(d)
                os.rename(real, d)
                os.rename(d, real)
            except OSError:
                pass

    rounds = 10
    per_round = 30
    fake_model.script(
        *[Reply.tools(*[ToolCall("file-read", {"path": "d/f"}) for _ in range(per_round)]) for _ in range(rounds)],
        Reply(text="done"),
    )
    thread = threading.Thread(target=flip)
    thread.start()
    try:
        outcome = dispatch(daemon, "race")
    finally:
        stop.set()
        thread.join()
    seen: dict[str, int] = {}
    for request in range(3, 3 + rounds):
        for result in tool_results(fake_model, request)[-per_round:]:
            key = result.get("content", result.get("error", {}).get("code"))
            assert key in ("inside", "path_refused", "file_not_found"), result
            seen[key] = seen.get(key, 0) + 1
    assert sum(seen.values()) == rounds * per_round and seen.get("path_refused", 0) + seen.get("file_not_found", 0) > 0, seen
    events = tool_events(daemon, outcome["intent_id"])
    assert len(events) == rounds * per_round
    assert (outside / "f").read_text() == SECRET
    assert daemon.stop() == 0
