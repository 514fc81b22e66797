"""Multi-turn A2A tasks: a Rune agent's ``rune@ask-user`` leaves its task INPUT_REQUIRED with the question, and a
message naming the task continues the same session, across a restart too (the fake model server scripted)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from covenant.audit.recent import records_since
from tests.a2a.conftest import rpc, serve_a2a
from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure

QUESTION = "Where do you fly from?"


def _say(text: str, *, task_id: str | None = None, context_id: str | None = None, message_id: str = "m") -> dict:
    message: dict[str, Any] = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
    if task_id is not None:
        message["taskId"] = task_id
    if context_id is not None:
        message["contextId"] = context_id
    return {"message": message}


def _ask() -> Reply:
    return Reply.tools(ToolCall("ask-user", {"question": QUESTION}))


def test_ask_user_leaves_the_task_input_required_and_its_own_client_alone_continues_it(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, "travel", toolset=("rune@ask-user",))
    served = serve_a2a(daemon, expose=("travel",), before=(daemon.home / "covenant.toml").read_text())
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.ask_user", check=True)
    fake_model.script(_ask(), _ask())

    first = rpc(served, "travel", "SendMessage", _say("Book me a flight")).json()["result"]["task"]
    assert first["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", first
    assert first["status"]["message"]["parts"] == [{"text": QUESTION}] and "artifacts" not in first
    record = daemon.api("GET", f"/v1/dispatches/{first['id']}")
    assert record["outcome"] == "ok" and record["result"]["input_required"] is True  # type: ignore[index]
    # A second task of the same client asks too, and is canceled while it waits: nothing runs, it ends.
    second = rpc(served, "travel", "SendMessage", _say("Book another")).json()["result"]["task"]
    assert second["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    canceled = rpc(served, "travel", "CancelTask", {"id": second["id"]}).json()["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"

    # Hostile and mistaken continuations: another client's token finds no task; a wrong contextId, a task
    # that has ended, or a taskId that does not exist are refused as A2A says; none of them reaches the model.
    other = rpc(served, "travel", "SendMessage", _say("From Mallory's", task_id=first["id"]), token=served.other_token)
    assert other.json()["error"]["code"] == -32001
    wrong_context = rpc(served, "travel", "SendMessage", _say("x", task_id=first["id"], context_id="not-its-context"))
    assert wrong_context.json()["error"]["code"] == -32602
    assert rpc(served, "travel", "SendMessage", _say("x", task_id=second["id"])).json()["error"]["code"] == -32004
    assert rpc(served, "travel", "SendMessage", _say("x", task_id="no-such-task")).json()["error"]["code"] == -32001
    assert len(fake_model.requests) == 2

    # The questions outlive a restart: the task still waits, the canceled one stays canceled.
    assert daemon.stop() == 0
    daemon.start()
    fake_model.script(Reply(text="Booked from Lisbon."))
    waiting = rpc(served, "travel", "GetTask", {"id": first["id"]}).json()["result"]
    assert waiting["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert waiting["status"]["message"]["parts"] == [{"text": QUESTION}]
    assert rpc(served, "travel", "GetTask", {"id": second["id"]}).json()["result"]["status"]["state"] == "TASK_STATE_CANCELED"
    assert rpc(served, "travel", "SendMessage", _say("x", task_id=second["id"])).json()["error"]["code"] == -32004

    # The answer, naming the task alone (its contextId is inferred), continues the same session to its end.
    answered = rpc(served, "travel", "SendMessage", _say("From Lisbon", task_id=first["id"], message_id="m2"))
    task = answered.json()["result"]["task"]
    assert task["id"] == first["id"] and task["contextId"] == first["contextId"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED" and task["artifacts"][0]["parts"] == [{"text": "Booked from Lisbon."}]
    said = [(m["role"], m.get("content")) for m in fake_model.requests[2].messages if m["role"] != "system"]
    assert said[0] == ("user", "Book me a flight") and ("assistant", QUESTION) in said
    assert said[-1] == ("user", "From Lisbon")  # the question, then the answer, in the task's own session
    assert rpc(served, "travel", "SendMessage", _say("again", task_id=first["id"])).json()["error"]["code"] == -32004

    # Audit: each turn an accepted a2a.request naming the task and its intent; the cancel of the waiting task
    # names the state it set, so a restart knows it.
    requests = [r["data"] for r in records_since(daemon.home / "audit", 0, frozenset({"a2a.request"}))[::-1]]
    turns = [r for r in requests if r.get("task") == first["id"] and r["outcome"] == "accepted"]
    assert len(turns) == 2 and turns[0]["intent"] == first["id"] and turns[1]["intent"] != first["id"]
    assert daemon.api("GET", f"/v1/dispatches/{turns[1]['intent']}")["session_id"] == first["contextId"]  # type: ignore[index]
    assert any(r.get("settled") == "CANCELED" and r["task"] == second["id"] for r in requests)
    assert daemon.stop() == 0


def test_a_streamed_continuation_ends_at_the_next_question_and_a_plain_answer_completes_the_task(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """A stream of a task ends when it waits for input (its last event the INPUT_REQUIRED status with the
    question); an answer with no rune@ask-user call is an ordinary COMPLETED task."""
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, "travel", toolset=("rune@ask-user", "rune@system-time"))
    served = serve_a2a(daemon, expose=("travel",), before=(daemon.home / "covenant.toml").read_text())
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.ask_user", "tool.system_time", check=True)
    fake_model.script(_ask(), Reply.tools(ToolCall("system-time", {}), ToolCall("ask-user", {"question": "And when?"})),
                      Reply(text=QUESTION))
    first = rpc(served, "travel", "SendMessage", _say("Book me a flight")).json()["result"]["task"]
    streamed = httpx.post(served.url("travel") + "/message:stream", headers=served.headers(), timeout=120,
                          json=_say("From Lisbon", task_id=first["id"]))
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[0]["task"]["id"] == first["id"] and events[0]["task"]["status"]["state"] == "TASK_STATE_WORKING"
    last = events[-1]["statusUpdate"]
    assert last["status"]["state"] == "TASK_STATE_INPUT_REQUIRED" and last["status"]["message"]["parts"] == [{"text": "And when?"}]
    # A plain answer that merely reads like a question completes the task: only the tool makes one.
    plain = rpc(served, "travel", "SendMessage", _say("Tomorrow", task_id=first["id"])).json()["result"]["task"]
    assert plain["status"]["state"] == "TASK_STATE_COMPLETED" and plain["artifacts"][0]["parts"] == [{"text": QUESTION}]
    assert daemon.stop() == 0
