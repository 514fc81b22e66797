"""Exposed agent.toml agents served over A2A to the official SDK's client: cards, blocking and streamed
messages, tasks read back and canceled, tokens, exposure, denials, caps, and the audit trail."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import trio

from covenant.audit.recent import records_since
from covenant.client import RemoteError
from tests.a2a.conftest import Served, cancel_a_task_held_by_the_audit_writer, message_params, rpc, serve_a2a, user_message
from tests.daemon.conftest import DaemonProcess, agent_processes
from tests.daemon.test_daemon_e2e import wait_for


def _setup(d: DaemonProcess) -> Served:
    d.add_agent("echo", "echo.py", keywords=("echo",))
    d.add_agent("guarded", "echo.py", required=("tool.echo",))
    d.add_agent("slow", "slow.py")
    d.add_agent("hidden", "echo.py")
    served = serve_a2a(d, expose=("echo", "guarded", "slow@local"), extra="max_body_kb = 1")
    d.start()
    return served


def _requests(d: DaemonProcess) -> list[dict]:
    return [r["data"] for r in records_since(d.home / "audit", 0, frozenset({"a2a.request"}))[::-1]]


async def test_sdk_client_sends_streams_reads_and_is_refused_where_it_must_be(daemon: DaemonProcess) -> None:
    from a2a.types import GetTaskRequest, TaskNotFoundError, TaskState

    served = _setup(daemon)

    # The card, as the SDK resolves it: no token needed; JSON-RPC and HTTP+JSON at the base URL.
    async with httpx.AsyncClient() as anonymous:
        raw_card = (await anonymous.get(served.url("echo") + "/.well-known/agent-card.json")).json()
    assert raw_card["name"] == "echo" and raw_card["capabilities"]["streaming"] is True
    assert {i["protocolBinding"] for i in raw_card["supportedInterfaces"]} == {"JSONRPC", "HTTP+JSON"}
    printed = daemon.cli("a2a", "card", "echo", "--json", check=True)
    assert json.loads(printed.stdout) == raw_card  # `covenant a2a card` prints the card as served
    assert daemon.cli("a2a", "card", "hidden").returncode == 6

    async with served.sdk("echo", streaming=False) as client:
        events = [e async for e in client.send_message(user_message("hello over A2A"))]
        assert len(events) == 1 and events[0].HasField("task")
        task = events[0].task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert [p.text for p in task.artifacts[0].parts] == ["hello over A2A"]
        again = await client.get_task(GetTaskRequest(id=task.id))
        assert again.status.state == TaskState.TASK_STATE_COMPLETED and again.context_id == task.context_id
    record = daemon.api("GET", f"/v1/dispatches/{task.id}")
    assert record["agent_id"] == "echo@local" and record["outcome"] == "ok"  # task id = intent id

    async with served.sdk("echo", streaming=True) as client:
        streamed = [e async for e in client.send_message(user_message("streamed words"))]
    kinds = [e.WhichOneof("payload") for e in streamed]
    assert kinds[0] == "task" and streamed[0].task.status.state == TaskState.TASK_STATE_WORKING
    assert "artifact_update" in kinds and kinds[-1] == "status_update"
    text = "".join(p.text for e in streamed if e.HasField("artifact_update") for p in e.artifact_update.artifact.parts)
    assert text == "streamed words"
    assert streamed[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED

    # Another client never sees this client's task, even with the same issuer behind it.
    async with served.sdk("echo", streaming=False, token=served.other_token) as other:
        with pytest.raises(TaskNotFoundError):
            await other.get_task(GetTaskRequest(id=task.id))

    # The issuer lacks the grant: the task is REJECTED with the reason; nothing ran.
    async with served.sdk("guarded", streaming=False) as client:
        rejected = [e async for e in client.send_message(user_message("let me in"))][0].task
    assert rejected.status.state == TaskState.TASK_STATE_REJECTED
    assert "capability_denied" in rejected.status.message.parts[0].text
    with pytest.raises(RemoteError, match="no dispatch record"):
        daemon.api("GET", f"/v1/dispatches/{rejected.id}")

    # No token or a wrong one: 401 (audited); an agent that is not exposed: 404 whatever the token.
    assert httpx.post(served.url("echo"), json={}, timeout=60).status_code == 401
    assert rpc(served, "echo", "SendMessage", {}, token="tok-wrong-wrong-wrong").status_code == 401
    assert rpc(served, "hidden", "SendMessage", {}).status_code == 404
    assert httpx.get(served.url("hidden") + "/.well-known/agent-card.json", timeout=60).status_code == 404
    assert rpc(served, "nobody", "SendMessage", {}).status_code == 404

    # A2A 0.3 names and shapes still work (raftio's clients), over the 0.3 card path too.
    card03 = httpx.get(served.url("echo") + "/agent-card", timeout=60).json()
    assert card03["protocolVersion"] == "0.3.0" and card03["url"] == served.url("echo")
    old = rpc(served, "echo", "message/send", {"message": {
        "kind": "message", "messageId": "m1", "role": "user", "parts": [{"kind": "text", "text": "old style"}]}})
    answer = old.json()["result"]
    assert answer["kind"] == "task" and answer["status"]["state"] == "completed"
    assert answer["artifacts"][0]["parts"] == [{"kind": "text", "text": "old style"}]
    listing = httpx.get(f"http://127.0.0.1:{served.port}/.well-known/agent.json", timeout=60).json()
    assert sorted(c["name"] for c in listing["agents"]) == ["echo", "guarded", "slow"]

    # The HTTP+JSON binding.
    sent = httpx.post(served.url("echo") + "/message:send", headers=served.headers(), timeout=120, json={
        "message": {"messageId": "m2", "role": "ROLE_USER", "parts": [{"text": "rest binding"}]}})
    rest_task = sent.json()["task"]
    assert rest_task["status"]["state"] == "TASK_STATE_COMPLETED"
    got = httpx.get(served.url("echo") + f"/tasks/{rest_task['id']}", headers=served.headers(), timeout=60)
    assert got.json()["artifacts"][0]["parts"] == [{"text": "rest binding"}]

    # Errors in JSON-RPC's terms; a body over max_body_kb is 413; over the client's rate 429.
    assert rpc(served, "echo", "NoSuchMethod", {}).json()["error"]["code"] == -32601
    assert rpc(served, "echo", "SendMessage", {"message": {"role": "ROLE_USER"}}).json()["error"]["code"] == -32602
    not_found = rpc(served, "echo", "GetTask", {"id": "nope"}).json()["error"]
    assert not_found["code"] == -32001 and not_found["data"] == [{
        "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TASK_NOT_FOUND", "domain": "a2a-protocol.org"}]
    assert rpc(served, "echo", "GetTask", {"id": "x"}, headers={"A2A-Version": "9.9"}).json()["error"]["code"] == -32009
    as_text = httpx.post(served.url("echo"), content=b"{}", timeout=60,
                         headers={**served.headers(), "Content-Type": "text/plain"})
    assert as_text.json()["error"]["code"] == -32005
    rest_missing = httpx.get(served.url("echo") + "/tasks/nope", headers=served.headers(), timeout=60)
    assert rest_missing.status_code == 404 and rest_missing.json()["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"
    big = rpc(served, "echo", "SendMessage", {"message": {"messageId": "m3", "role": "ROLE_USER",
                                                            "parts": [{"text": "x" * 2000}]}})
    assert big.status_code == 413
    # Unauthenticated bodies are never read; a client's own cap replaces [a2a] max_body_kb (here 4 KiB against 1).
    assert httpx.post(served.url("echo"), content=b"x" * 100_000, timeout=60).status_code == 401
    roomy = rpc(served, "echo", "GetTask", {"id": "y" * 2000}, token=served.other_token)
    assert roomy.status_code == 200 and roomy.json()["error"]["code"] == -32001
    statuses = [rpc(served, "echo", "GetTask", {"id": task.id}, token=served.other_token).status_code
                for _ in range(4)]
    assert statuses[-1] == 429

    # After a restart the client still reads its tasks: their owner from the audit log, their end from the
    # dispatch record (or, for a denial, from the intent's policy.decision).
    assert daemon.stop() == 0
    daemon.start()
    after = rpc(served, "echo", "GetTask", {"id": task.id}).json()["result"]
    assert after["status"]["state"] == "TASK_STATE_COMPLETED" and after["artifacts"][0]["parts"] == [{"text": "hello over A2A"}]
    denied_after = rpc(served, "guarded", "GetTask", {"id": rejected.id}).json()["result"]
    assert denied_after["status"]["state"] == "TASK_STATE_REJECTED"
    assert "capability_denied" in denied_after["status"]["message"]["parts"][0]["text"]
    assert rpc(served, "echo", "GetTask", {"id": task.id}, token=served.other_token).json()["error"]["code"] == -32001
    assert daemon.stop() == 0
    requests = _requests(daemon)
    outcomes = [(r["client"], r["method"], r["outcome"]) for r in requests]
    assert outcomes.count(("ci", "SendMessage", "accepted")) == 2  # echo and guarded (a denial is accepted, then REJECTED)
    for method in ("message/send", "SendStreamingMessage", "message:send"):
        assert ("ci", method, "accepted") in outcomes
    outcomes = [(r["client"], r["outcome"]) for r in requests]
    assert (None, "unauthorized") in outcomes and (None, "not_found") in outcomes
    assert ("other", "rate_limited") in outcomes
    assert all("text" not in r for r in requests)  # [audit] store_text is off
    for audit_file in (daemon.home / "audit").iterdir():
        assert b"hello over A2A" not in audit_file.read_bytes()
        assert served.token.encode() not in audit_file.read_bytes()


async def test_cancel_task_stops_a_long_run_and_leaves_no_process(daemon: DaemonProcess) -> None:
    from a2a.types import CancelTaskRequest, TaskState

    served = _setup(daemon)
    found: dict[str, object] = {}

    async with served.sdk("slow@local", streaming=True) as client:
        async def send() -> None:
            found["events"] = [e async for e in client.send_message(user_message("sleep 300"))]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            await trio.to_thread.run_sync(lambda: wait_for(lambda: agent_processes(daemon.home), timeout=60,
                                                           what="the slow agent's process"))
            task_id = next(iter(_running_tasks(daemon)))
            canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    events = found["events"]
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED  # type: ignore[attr-defined]
    assert not agent_processes(daemon.home)
    assert daemon.api("GET", f"/v1/dispatches/{task_id}")["outcome"] == "cancelled"
    again = rpc(served, "slow@local", "CancelTask", {"id": task_id}).json()
    assert again["error"]["code"] == -32002  # a finished task cannot be canceled
    assert daemon.stop() == 0


@contextmanager
def _one_slot_held(daemon: DaemonProcess) -> Iterator[tuple[Served, concurrent.futures.ThreadPoolExecutor, str]]:
    """A daemon with one run slot (``daemon.max_concurrent = 1``), held by a task of slow@local until the block
    ends, when that task is canceled. Yields the A2A server, a thread pool for more calls, the holder's id."""
    daemon.add_agent("slow", "slow.py")
    served = serve_a2a(daemon, expose=("slow@local",), before="[daemon]\nmax_concurrent = 1\n")
    daemon.start()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        holding = pool.submit(rpc, served, "slow@local", "SendMessage", message_params("sleep 300"))
        [holder] = _running_tasks(daemon)
        yield served, pool, holder
        assert [i["intent"] for i in daemon.api("GET", "/v1/status")["in_flight"]] == [holder]  # type: ignore[index]
        rpc(served, "slow@local", "CancelTask", {"id": holder})
        assert holding.result(timeout=60).json()["result"]["task"]["status"]["state"] == "TASK_STATE_CANCELED"


def test_cancel_task_of_a_task_waiting_for_a_slot_cancels_it_before_its_agent_starts(daemon: DaemonProcess) -> None:
    """It was answered -32002 (as if it had ended) and then ran once a slot freed."""
    with _one_slot_held(daemon) as (served, pool, holder):
        waiting = pool.submit(rpc, served, "slow@local", "SendMessage", message_params("sleep 1"))
        wait_for(lambda: daemon.api("GET", "/v1/status")["queued"] == 1, what="the second task queued")
        listed = rpc(served, "slow@local", "ListTasks", {}).json()["result"]["tasks"]
        [queued] = [t["id"] for t in listed if t["id"] != holder]
        canceled = rpc(served, "slow@local", "CancelTask", {"id": queued}).json()
        assert canceled["result"]["status"]["state"] == "TASK_STATE_CANCELED", canceled
        answer = waiting.result(timeout=60).json()
        assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_CANCELED", answer
        record = daemon.api("GET", f"/v1/dispatches/{queued}")
        assert record["outcome"] == "cancelled" and record["pid"] is None, record  # type: ignore[index]
        assert "canceled the task" in record["error"]  # type: ignore[index]
    events = [r["data"] for r in records_since(daemon.home / "audit", 0, frozenset({"agent.spawned", "intent.completed"}))]
    assert [e["intent"] for e in events if "pid" in e] == [holder], "the cancelled task's agent never started"
    assert {e["intent"]: e["outcome"] for e in events if "outcome" in e} == {holder: "cancelled", queued: "cancelled"}
    assert not agent_processes(daemon.home)
    assert daemon.stop() == 0


def test_cancel_task_of_a_task_still_being_decided_is_applied_before_its_agent_starts(daemon: DaemonProcess) -> None:
    """The cancel comes while the daemon audits a grants change ahead of the task's decision (the audit
    writer stopped): the task had nothing to stop yet, so it was answered -32002 and then ran."""
    served = _setup(daemon)
    daemon.cli("grant", "tester@test", "tool.echo", check=True)  # the next dispatch audits this change first
    task = cancel_a_task_held_by_the_audit_writer(daemon, served, "slow@local", "sleep 300")
    record = daemon.api("GET", f"/v1/dispatches/{task}")
    assert record["outcome"] == "cancelled" and record["pid"] is None, record  # type: ignore[index]
    spawned = records_since(daemon.home / "audit", 0, frozenset({"agent.spawned"}))
    assert all(r["data"]["intent"] != task for r in spawned) and not agent_processes(daemon.home)
    assert daemon.stop() == 0


def test_cancel_task_of_a_task_still_being_decided_keeps_it_out_of_the_queue(daemon: DaemonProcess) -> None:
    """The one slot is taken, so the task would queue once decided: the cancel that came while it was decided
    ends it there. It queued, and waited for the slot before its cancel was applied."""
    with _one_slot_held(daemon) as (served, _, _):
        daemon.cli("grant", "tester@test", "tool.echo", check=True)  # the next dispatch audits this change first
        task = cancel_a_task_held_by_the_audit_writer(daemon, served, "slow@local", "sleep 1", admitted=2)
        assert daemon.api("GET", "/v1/status")["queued"] == 0  # type: ignore[index]
    record = daemon.api("GET", f"/v1/dispatches/{task}")
    assert record["outcome"] == "cancelled" and record["pid"] is None, record  # type: ignore[index]
    assert not agent_processes(daemon.home)
    assert daemon.stop() == 0


def _running_tasks(d: DaemonProcess) -> list[str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ids = [i["intent"] for i in d.api("GET", "/v1/status")["in_flight"]]
        if ids:
            return ids
        time.sleep(0.05)
    raise AssertionError(f"no dispatch in flight: {json.dumps(d.api('GET', '/v1/status'))[:500]}")
