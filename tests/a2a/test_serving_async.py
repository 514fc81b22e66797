"""What A2A 1.0 clients expect beyond one blocking message: returnImmediately, SubscribeToTask on a running
task, cards with ETag and Cache-Control, and raw parts of a text media type (httpx against a real daemon)."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
from pathlib import Path

import httpx

from covenant.audit.recent import records_since
from tests.a2a.conftest import message_params, rpc, serve_a2a
from tests.daemon.conftest import DaemonProcess, agent_processes
from tests.daemon.test_daemon_e2e import wait_for


def _gate(d: DaemonProcess) -> Path:
    """A folder the gate agent (running as an agent uid of its own) writes ``started`` to and waits for ``go`` in."""
    folder = d.home.parent / "gate"
    folder.mkdir()
    os.chmod(folder, 0o777)
    return folder


def _events(response: httpx.Response) -> list[dict]:
    """The ``data:`` events of a text/event-stream answer read to its end."""
    return [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]


def _immediate(text: str) -> dict:
    return {**message_params(text), "configuration": {"returnImmediately": True}}


def test_return_immediately_answers_working_and_get_and_subscribe_follow_the_task_to_its_end(
    daemon: DaemonProcess,
) -> None:
    gate = _gate(daemon)
    daemon.add_agent("gate", "gate.py")
    served = serve_a2a(daemon, expose=("gate",))
    daemon.start()

    # returnImmediately: the answer comes while the agent waits for a file no one has written yet.
    sent = rpc(served, "gate", "SendMessage", _immediate(f"wait in {gate}")).json()
    task = sent["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_WORKING" and "artifacts" not in task, sent
    wait_for(lambda: (gate / "started").exists(), timeout=60, what="the agent started")
    assert (gate / "started").read_text().strip() == task["id"]  # the task id is the intent id
    got = rpc(served, "gate", "GetTask", {"id": task["id"]}).json()["result"]
    assert got["status"]["state"] == "TASK_STATE_WORKING"
    more = {"message": {"messageId": "m-more", "role": "ROLE_USER", "taskId": task["id"], "parts": [{"text": "hurry"}]}}
    assert rpc(served, "gate", "SendMessage", more).json()["error"]["code"] == -32004  # it waits for no input

    # SubscribeToTask on the running task: the task first, then (once the file is there) the answer and the end.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jsonrpc = pool.submit(rpc, served, "gate", "SubscribeToTask", {"id": task["id"]})
        rest = pool.submit(httpx.post, served.url("gate") + f"/tasks/{task['id']}:subscribe",
                           headers=served.headers(), timeout=120)
        wait_for(lambda: sum(r["data"].get("method") in ("SubscribeToTask", "tasks:subscribe")
                             for r in records_since(daemon.home / "audit", 0, frozenset({"a2a.request"}))) == 2,
                 timeout=60, what="both subscriptions open")
        assert not jsonrpc.done() and not rest.done()
        (gate / "go").write_text("")
        streamed = [e["result"] for e in _events(jsonrpc.result(timeout=60))]
        rest_events = _events(rest.result(timeout=60))
    assert streamed[0]["task"]["status"]["state"] == "TASK_STATE_WORKING"
    assert streamed[1]["artifactUpdate"]["artifact"]["parts"] == [{"text": "went"}]
    assert streamed[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED" and len(streamed) == 3
    assert [next(iter(e)) for e in rest_events] == ["task", "artifactUpdate", "statusUpdate"]
    done = rpc(served, "gate", "GetTask", {"id": task["id"]}).json()["result"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED" and done["artifacts"][0]["parts"] == [{"text": "went"}]

    # An ended task cannot be subscribed to (-32004); another client's, or none, is not found (-32001).
    assert rpc(served, "gate", "SubscribeToTask", {"id": task["id"]}).json()["error"]["code"] == -32004
    assert rpc(served, "gate", "SubscribeToTask", {"id": task["id"]}, token=served.other_token).json()["error"]["code"] == -32001
    assert rpc(served, "gate", "SubscribeToTask", {"id": "no-such-task"}).json()["error"]["code"] == -32001
    # A bad configuration is refused before any task is made; the 0.3 spelling (blocking: false) works too.
    bad = rpc(served, "gate", "SendMessage", {**message_params("x"), "configuration": {"returnImmediately": "yes"}})
    assert bad.json()["error"]["code"] == -32602
    (gate / "started").unlink()
    old = rpc(served, "gate", "message/send", {"configuration": {"blocking": False}, "message": {
        "kind": "message", "messageId": "m-old", "role": "user", "parts": [{"kind": "text", "text": f"in {gate}"}]}})
    assert old.json()["result"]["status"]["state"] in ("working", "completed"), old.json()
    wait_for(lambda: rpc(served, "gate", "GetTask", {"id": old.json()["result"]["id"]}).json()["result"]["status"]["state"]
             == "TASK_STATE_COMPLETED", timeout=60, what="the 0.3 task's end")

    # A task whose client did not wait still ends in the record after a restart, and its client reads it.
    assert daemon.stop() == 0
    daemon.start()
    after = rpc(served, "gate", "GetTask", {"id": task["id"]}).json()["result"]
    assert after["status"]["state"] == "TASK_STATE_COMPLETED" and after["artifacts"][0]["parts"] == [{"text": "went"}]
    assert not agent_processes(daemon.home)
    assert daemon.stop() == 0


def test_a_task_left_running_is_drained_with_the_daemon_and_reads_as_canceled_after_its_restart(
    daemon: DaemonProcess,
) -> None:
    """A returnImmediately task has no client waiting on it: a stop drains it like any dispatch (the drain
    times out here, so it is cancelled), no process is left, and its end is on record for its client."""
    gate = _gate(daemon)
    daemon.add_agent("gate", "gate.py")
    served = serve_a2a(daemon, expose=("gate",), before="[daemon]\ndrain_timeout_s = 1\n")
    daemon.start()
    task = rpc(served, "gate", "SendMessage", _immediate(f"wait in {gate}")).json()["result"]["task"]
    wait_for(lambda: (gate / "started").exists(), timeout=60, what="the agent started")
    assert daemon.stop() == 5  # the drain timed out and cancelled the task
    assert not agent_processes(daemon.home)
    daemon.start()
    after = rpc(served, "gate", "GetTask", {"id": task["id"]}).json()["result"]
    assert after["status"]["state"] == "TASK_STATE_CANCELED", after
    assert daemon.api("GET", f"/v1/dispatches/{task['id']}")["outcome"] == "cancelled"  # type: ignore[index]
    assert daemon.stop() == 0


def test_cards_carry_an_etag_and_cache_control_and_raw_text_parts_are_read(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py")
    served = serve_a2a(daemon, expose=("echo",), extra="max_body_kb = 1024")
    daemon.start()
    for path in ("/.well-known/agent-card.json", "/agent-card"):
        first = httpx.get(served.url("echo") + path, timeout=60)
        etag = first.headers["etag"]
        assert first.status_code == 200 and etag.startswith('"') and len(etag) == 66
        assert first.headers["cache-control"] == "public, max-age=60"
        again = httpx.get(served.url("echo") + path, headers={"If-None-Match": etag}, timeout=60)
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
        weak = httpx.get(served.url("echo") + path, headers={"If-None-Match": f'"stale", W/{etag}'}, timeout=60)
        assert weak.status_code == 304
        stale = httpx.get(served.url("echo") + path, headers={"If-None-Match": '"stale"'}, timeout=60)
        assert stale.status_code == 200 and stale.json() == first.json()
    listing = httpx.get(f"http://127.0.0.1:{served.port}/.well-known/agent.json", timeout=60)
    assert "etag" in listing.headers and "max-age" in listing.headers["cache-control"]

    def send(*parts: dict) -> dict:
        return rpc(served, "echo", "SendMessage", {"message": {
            "messageId": "m-raw", "role": "ROLE_USER", "parts": list(parts)}}).json()

    text = "ünïcode lines\nand more"
    raw = base64.b64encode(text.encode()).decode()
    answered = send({"raw": raw, "mediaType": "text/plain; charset=utf-8", "filename": "note.txt"})
    assert answered["result"]["task"]["artifacts"][0]["parts"] == [{"text": text}]
    as_json = send({"text": "head"}, {"raw": base64.urlsafe_b64encode(b'{"a": 1}').decode().rstrip("="),
                                      "mediaType": "application/json"})
    assert as_json["result"]["task"]["artifacts"][0]["parts"] == [{"text": 'head\n{"a": 1}'}]
    old = rpc(served, "echo", "message/send", {"message": {"kind": "message", "messageId": "m-f", "role": "user", "parts": [
        {"kind": "file", "file": {"bytes": raw, "mimeType": "text/markdown"}}]}}).json()
    assert old["result"]["artifacts"][0]["parts"] == [{"kind": "text", "text": text}]

    # Not text, no media type, a URL (never fetched), bytes that are not UTF-8, not base64: refused, nothing runs.
    before = len(daemon.api("GET", "/v1/dispatches?limit=100")["dispatches"])  # type: ignore[index]
    refused = [
        (send({"raw": base64.b64encode(b"\x89PNG").decode(), "mediaType": "image/png"}), -32005),
        (send({"raw": raw}), -32005),
        (send({"url": f"http://127.0.0.1:{served.port}/secret", "mediaType": "text/plain"}), -32005),
        (send({"raw": base64.b64encode(b"ok \xff\xfe").decode(), "mediaType": "text/plain"}), -32602),
        (send({"raw": "not base64 !", "mediaType": "text/plain"}), -32602),
        (send({"raw": raw, "mediaType": "text/plain; charset=latin-1"}), -32005),
        (send({"raw": base64.b64encode(b"x" * (256 * 1024 + 1)).decode(), "mediaType": "text/plain"}), -32602),
    ]
    for answer, code in refused:
        assert answer["error"]["code"] == code, answer
    assert "parts[0]" in refused[0][0]["error"]["message"]
    assert len(daemon.api("GET", "/v1/dispatches?limit=100")["dispatches"]) == before  # type: ignore[index]
    assert daemon.stop() == 0
