"""A Rune agent served over A2A: its card, a conversation continued through contextId, tokens streamed
as artifact updates (scripted fake model provider, the SDK's client)."""

from __future__ import annotations

import concurrent.futures
import os
import signal

from a2a.types import TaskState

from tests.a2a.conftest import cancel_a_task_held_by_the_audit_writer, message_params, rpc, serve_a2a, user_message
from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of
from tests.workflow.conftest import agent_tool, record, rune_agent


ANSWER = "Your name is Ada.\nYou told me so.\nAnything else?"
"""Three lines: redaction (safety_policy standard) holds back at most the current line."""


async def test_a_rune_agent_keeps_its_context_and_streams_its_tokens(daemon: DaemonProcess,
                                                                     fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, "chat", toolset=())
    served = serve_a2a(daemon, expose=("chat",), before=(daemon.home / "covenant.toml").read_text())
    daemon.start()
    fake_model.script(Reply(text="Nice to meet you, Ada."), Reply(text=ANSWER))

    async with served.sdk("chat", streaming=False) as client:
        assert client._card.description == "You are a covenant test agent."  # the instructions' first line
        first = [e async for e in client.send_message(user_message("My name is Ada."))][0].task
        assert first.status.state == TaskState.TASK_STATE_COMPLETED
        assert first.artifacts[0].parts[0].text == "Nice to meet you, Ada."
    async with served.sdk("chat", streaming=True) as client:
        events = [e async for e in client.send_message(user_message("What is my name?", context_id=first.context_id))]

    chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert len(chunks) > 1  # the provider's tokens, relayed as they came
    assert chunks[0].append is False and all(c.append for c in chunks[1:]) and chunks[-1].last_chunk
    assert "".join(p.text for c in chunks for p in c.artifact.parts) == ANSWER
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert events[-1].status_update.context_id == first.context_id

    second_request = fake_model.requests[1]
    said = [m["content"] for m in second_request.messages if m["role"] in ("user", "assistant")]
    assert said[:3] == ["My name is Ada.", "Nice to meet you, Ada.", "What is my name?"]  # the session went on
    record = daemon.api("GET", f"/v1/dispatches/{events[0].task.id}")
    assert record["session_id"] == first.context_id
    assert daemon.stop() == 0


def test_cancel_task_while_the_decision_is_written_stops_it_before_its_replica_is_asked(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """The cancel comes while the task's decision is being made durable (the audit writer stopped): it was
    answered -32002, as if the task had ended, and the task then ran to its end."""
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, "chat", toolset=())
    served = serve_a2a(daemon, expose=("chat",), before=(daemon.home / "covenant.toml").read_text())
    daemon.start()
    fake_model.script(Reply(text="warm"), Reply(text="never asked"))
    assert outcome_of(daemon.cli("dispatch", "warm up", "--agent", "chat@local", "--json"))["text"] == "warm"
    task = cancel_a_task_held_by_the_audit_writer(daemon, served, "chat", "stalled")
    record = daemon.api("GET", f"/v1/dispatches/{task}")
    assert record["outcome"] == "cancelled" and record["error"] == "A2A client ci canceled the task", record  # type: ignore[index]
    assert len(fake_model.requests) == 1, "only the warm-up reached the model"
    assert daemon.stop() == 0


def test_cancel_task_of_a_rune_task_also_stops_the_agent_it_is_calling(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """The callee runs under the caller's replica's tool call, not under the caller's cancel scope. Here the
    caller's replica is frozen (SIGSTOP) and so keeps that call open: the daemon itself must stop the callee
    with its caller. It ran on until the frozen replica was replaced (≈ 15 s of failed probes) or its model
    answered (30 s). The caller's record waits for it, so it holds the callee's outcome."""
    configure(daemon, ("fake", fake_model))
    tool = agent_tool("ask_friend", "friend", timeout_ms=600000)
    rune_agent(daemon, "caller", toolset=("ask_friend",), tools=tool, timeout_ms=600_000)
    rune_agent(daemon, "friend", timeout_ms=600_000)
    served = serve_a2a(daemon, expose=("caller",), before=(daemon.home / "covenant.toml").read_text())
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(Reply.tools(ToolCall("ask_friend", {"input": "take your time"})), Reply(text="late", delay_s=30))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        sent = pool.submit(rpc, served, "caller", "SendMessage", message_params("go"))
        fake_model.wait_for_requests(2)  # the friend's model is thinking
        [caller] = [r["pid"] for r in daemon.api("GET", "/v1/status")["replicas"] if r["agent"] == "caller@local"]  # type: ignore[index]
        os.kill(caller, signal.SIGSTOP)
        try:
            [task] = [t["id"] for t in rpc(served, "caller", "ListTasks", {}).json()["result"]["tasks"]]
            canceled = rpc(served, "caller", "CancelTask", {"id": task}).json()
            assert canceled["result"]["status"]["state"] == "TASK_STATE_CANCELED", canceled
            assert sent.result(timeout=60).json()["result"]["task"]["status"]["state"] == "TASK_STATE_CANCELED"
            (child,) = record(daemon, task)["children"]
            assert child["outcome"] == "cancelled", child  # the caller's record waited for it to end
            child_record = record(daemon, child["intent"])
        finally:
            os.kill(caller, signal.SIGCONT)
    assert child_record["outcome"] == "cancelled" and child_record["duration_ms"] < 10_000, child_record
    assert child_record["error"] == "covenant stopped the intent: the intent that called it ended"
    assert len(fake_model.requests) == 2
    assert daemon.stop() == 0
