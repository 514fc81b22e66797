"""The fake model server itself: loud when unscripted, clean teardown (the adapters' tests cover the formats)."""

from __future__ import annotations

import threading
import time

import httpx

from tests.fakes import FakeModelServer, Reply


def test_an_unscripted_request_gets_500_and_is_listed() -> None:
    with FakeModelServer() as fake:
        response = httpx.post(f"{fake.base_url}/chat/completions", json={"model": "m", "messages": []})
        assert response.status_code == 500
        assert "no scripted reply left" in response.json()["error"]["message"]
        assert [r.path for r in fake.unscripted] == ["/v1/chat/completions"]


def test_a_default_reply_answers_once_the_script_is_used_up_and_paths_without_v1_work() -> None:
    with FakeModelServer(default=Reply(text="default")) as fake:
        fake.script(Reply(text="scripted"))
        texts = [
            httpx.post(f"{fake.url}/chat/completions", json={"messages": []}).json()["choices"][0]["message"]["content"]
            for _ in range(2)
        ]
        assert texts == ["scripted", "default"]
        assert fake.unscripted == []


def test_close_wakes_a_delayed_reply_ends_idle_connections_and_leaves_no_thread() -> None:
    before = set(threading.enumerate())
    fake = FakeModelServer().start()
    fake.script(Reply(text="ok"), Reply(text="late", delay_s=600))
    idle = httpx.Client()
    assert idle.post(f"{fake.base_url}/chat/completions", json={"messages": []}).status_code == 200  # kept alive
    failed: list[BaseException] = []

    def slow_request() -> None:
        try:
            httpx.post(f"{fake.base_url}/chat/completions", json={"messages": []}, timeout=60)
        except httpx.HTTPError as exc:
            failed.append(exc)

    waiter = threading.Thread(target=slow_request)
    waiter.start()
    fake.wait_for_requests(2)
    started = time.monotonic()
    fake.close()
    waiter.join(timeout=30)
    idle.close()
    assert time.monotonic() - started < 20
    assert not waiter.is_alive() and failed, "the delayed request ends without an answer"
    assert set(threading.enumerate()) <= before
