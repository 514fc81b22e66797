"""Hostile: a Rune agent's tool goes after the agent's sessions, every issuer's conversations with it.

The replica loads and appends sessions through the daemon's gateway; the files are the daemon's (0700
folder, 0600 files), so a process of the agent's uid can neither read nor change them.
"""

from __future__ import annotations

import os

import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of
from tests.rune.test_file_tools import tool_results
from tests.security.conftest import start_with_hostile_tool

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the tool runs as the agent's uid only under a root daemon")


def test_a_tool_of_the_agent_can_neither_read_nor_change_its_sessions(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    start_with_hostile_tool(daemon, fake_model, "peek", "session_peek.py")
    folder = daemon.home / "state" / "sessions" / "chat@local"
    fake_model.script(Reply(text="noted"), Reply.tools(ToolCall("peek", {"folder": str(folder), "file": "private.jsonl"})),
                      Reply(text="done"))
    kept = outcome_of(daemon.cli("dispatch", "my secret is 42", "--agent", "chat@local", "--json", "--session", "private"))
    assert kept["outcome"] == "ok" and kept["session_id"] == "private", kept
    before = (folder / "private.jsonl").read_bytes()
    assert b"my secret is 42" in before

    peeked = outcome_of(daemon.cli("dispatch", "look around", "--agent", "chat@local", "--json"))
    assert peeked["outcome"] == "ok", peeked
    tried = tool_results(fake_model, 2)[-1]
    assert tried == {"list": "PermissionError", "read": "PermissionError", "write": "PermissionError",
                     "create": "PermissionError"}, tried
    assert (folder / "private.jsonl").read_bytes() == before
    assert (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (os.getuid(), 0o700)
    assert ((folder / "private.jsonl").stat().st_uid, (folder / "private.jsonl").stat().st_mode & 0o777) == (os.getuid(), 0o600)
    assert daemon.cli("sessions", "verify", "chat@local", "private").returncode == 0


def test_sessions_an_older_covenant_let_the_replica_write_become_the_daemons(
    daemon: DaemonProcess, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from covenant.policy.identities import load_user_identity
    from covenant.rune.sessions import SessionLog

    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, toolset=())
    monkeypatch.setenv("XDG_CONFIG_HOME", daemon.env["XDG_CONFIG_HOME"])
    folder = daemon.home / "state" / "sessions" / "chat@local"
    folder.mkdir(parents=True)
    old = SessionLog.create(folder / "old.jsonl", agent="chat@local", session="old",
                            issuer=load_user_identity().pubkey, now_ms=1)
    old.append_turn("intent-0", [{"role": "user", "content": "remember me"}, {"role": "assistant", "content": "sure"}])
    for path in (folder, folder / "old.jsonl"):
        os.chown(path, 54321, 54321)  # as an agent uid of an older covenant left them
    daemon.start()
    fake_model.script(Reply(text="you said: remember me"))
    outcome = outcome_of(daemon.cli("dispatch", "what did I say?", "--agent", "chat@local", "--json", "--session", "old"))
    assert outcome["outcome"] == "ok", outcome
    assert [m["content"] for m in fake_model.requests[0].messages[1:]] == ["remember me", "sure", "what did I say?"]
    assert {folder.stat().st_uid, (folder / "old.jsonl").stat().st_uid} == {os.getuid()}
