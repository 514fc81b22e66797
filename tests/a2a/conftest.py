"""A real daemon serving A2A on loopback, and the official A2A SDK's client as the outside party."""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.daemon.test_daemon_e2e import wait_for

TOKEN_ENV = "A2A_TOKEN_CI"
OTHER_ENV = "A2A_TOKEN_OTHER"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """Where the daemon serves A2A, and the clients' tokens."""

    def __init__(self, d: DaemonProcess, port: int) -> None:
        self.daemon = d
        self.port = port
        self.token = "tok-" + secrets.token_hex(16)
        self.other_token = "tok-" + secrets.token_hex(16)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/a2a/{name}"

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    @asynccontextmanager
    async def sdk(self, name: str, *, streaming: bool, token: str | None = None) -> AsyncIterator[Any]:
        """The SDK's client for agent ``name``, built from the card it resolves (under trio, over httpx)."""
        from a2a.client import A2ACardResolver, ClientConfig, ClientFactory

        async with httpx.AsyncClient(headers=self.headers(token), timeout=120) as http:
            card = await A2ACardResolver(http, self.url(name)).get_agent_card()
            client = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card)
            yield client


def serve_a2a(d: DaemonProcess, *, expose: tuple[str, ...], extra: str = "", before: str = "") -> Served:
    """covenant.toml with an [a2a] listener on a free port and two clients speaking for tester@test."""
    served = Served(d, free_port())
    d.env[TOKEN_ENV] = served.token
    d.env[OTHER_ENV] = served.other_token
    exposed = ", ".join(f'"{name}"' for name in expose)
    d.write_config(f"""
        {before}
        [a2a]
        listen = "127.0.0.1:{served.port}"
        expose = [{exposed}]
        {extra}

        [[a2a.clients]]
        name = "ci"
        token_env = "{TOKEN_ENV}"
        issuer = "tester@test"
        rate = "600/minute"

        [[a2a.clients]]
        name = "other"
        token_env = "{OTHER_ENV}"
        issuer = "tester@test"
        rate = "3/minute"
        max_body_kb = 4
    """)
    return served


def user_message(text: str, *, context_id: str | None = None) -> Any:
    from a2a.types import Message, Part, Role, SendMessageRequest

    message = Message(message_id=secrets.token_hex(8), role=Role.ROLE_USER, parts=[Part(text=text)])
    if context_id:
        message.context_id = context_id
    return SendMessageRequest(message=message)


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def rpc(served: Served, name: str, method: str, params: dict, *, token: str | None = None,
        headers: dict[str, str] | None = None) -> httpx.Response:
    """One JSON-RPC call to the exposed agent ``name``, as the ``ci`` client (or with ``token``)."""
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    return httpx.post(served.url(name), json=body, headers={**served.headers(token), **(headers or {})}, timeout=120)


def message_params(text: str) -> dict:
    """SendMessage params (A2A 1.0 JSON) of one user message with one text part."""
    return {"message": {"messageId": text.replace(" ", "-"), "role": "ROLE_USER", "parts": [{"text": text}]}}


def cancel_a_task_held_by_the_audit_writer(d: DaemonProcess, served: Served, name: str, text: str,
                                           *, admitted: int = 1) -> str:
    """Send ``text`` to ``name`` with the audit writer stopped (SIGSTOP), so the task waits at its first audit
    write; CancelTask it there, then resume the writer. Asserts both calls answer a CANCELED task; returns its id.

    The caller sets up what the first write is (a grants change ahead of the decision, the decision itself);
    ``admitted``: the daemon's count of admitted dispatches once this one is (others may be running).
    """
    writer = d.api("GET", "/v1/status")["audit"]["writer_pid"]  # type: ignore[index]
    before = task_ids(served, name)
    os.kill(writer, signal.SIGSTOP)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            sent = pool.submit(rpc, served, name, "SendMessage", message_params(text))
            wait_for(lambda: d.api("GET", "/v1/status")["admitted"] == admitted, what="the task admitted")
            [task] = [t for t in task_ids(served, name) if t not in before]
            canceled = pool.submit(rpc, served, name, "CancelTask", {"id": task})
            wait_for(lambda: f"msg=\"intent cancel requested\" intent={task}" in d.log(), what="the cancel")
            os.kill(writer, signal.SIGCONT)
            assert canceled.result(timeout=60).json()["result"]["status"]["state"] == "TASK_STATE_CANCELED"
            assert sent.result(timeout=60).json()["result"]["task"]["status"]["state"] == "TASK_STATE_CANCELED"
    finally:
        os.kill(writer, signal.SIGCONT)
    return task


def task_ids(served: Served, name: str) -> list[str]:
    """The ids of the ``ci`` client's tasks on ``name`` (ListTasks)."""
    return [t["id"] for t in rpc(served, name, "ListTasks", {}).json()["result"]["tasks"]]
