"""One delivery's refusal paths, against the real NATS cluster and a stand-in daemon on a unix socket.

A real daemon answers 503 only in a race (the fleet process pulls nothing while its daemon is full
or draining), so the stand-in answers ``POST /v1/dispatch`` with the 503 a full daemon gives, and
records what the fleet asks it to audit. What is under test, :class:`Deliveries` with real
messages from a real consumer, is not replaced.
"""

from __future__ import annotations

import asyncio
import json
import socketserver
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from covenant.fleet.client import FleetClient
from covenant.fleet.config import FleetConfig
from covenant.fleet.daemon_link import DaemonLink
from covenant.fleet.delivery import Deliveries
from covenant.fleet.streams import ensure_consumer, ensure_streams
from covenant.fleet.subjects import INTENTS_STREAM, MSG_ID_HEADER, consumer_name, intent_subject
from tests.fleet.conftest import signed
from tests.fleet.nats_cluster import NatsCluster

pytestmark = pytest.mark.xdist_group("fleet")


class _FullDaemon(BaseHTTPRequestHandler):
    """Answers every dispatch ``503 overloaded``; keeps the fleet events it is asked to record: on their
    own (``fleet.ack``), or beside a dispatch (``fleet.delivery``, as the daemon writes it with the intent's
    first events)."""

    events: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/fleet/events":
            self.events.append(body)
            self._answer(200, {"seq": len(self.events)})
        else:
            assert set(body["fleet"]) == {"delivery", "consumer", "host"}, body
            self.events.append({"type": "fleet.delivery", "data": {"intent": body["intent"]["id"], **body["fleet"]}})
            self._answer(503, {"error": {"code": "overloaded", "message": "the wait queue is full"}})

    def _answer(self, status: int, document: dict[str, Any]) -> None:
        payload = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass

    def address_string(self) -> str:  # a unix socket has no host:port
        return "local"


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def full_daemon() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    folder = Path(tempfile.mkdtemp(prefix="cov-full-"))
    path = str(folder / "covenant.sock")
    _FullDaemon.events = []
    server = _UnixHTTPServer(path, _FullDaemon)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path, _FullDaemon.events
    server.shutdown()
    server.server_close()


def test_a_full_daemon_naks_and_the_last_delivery_is_answered_delivery_exhausted(
        nats_cluster: NatsCluster, full_daemon: tuple[str, list[dict[str, Any]]]) -> None:
    socket_path, events = full_daemon
    config = FleetConfig(servers=tuple(nats_cluster.servers), ack_wait_s=30, max_deliver=2)
    agent = "full-delivery@local"
    body = signed("anything", agent)
    intent_id = body["intent"]["id"]

    async def scenario() -> tuple[list[int], dict[str, Any] | None]:
        async with FleetClient(config) as client:
            await ensure_streams(client.js, config)
            await ensure_consumer(client.js, agent, config)
            deliveries = Deliveries("host-x", client.js, DaemonLink(socket_path), client.nc.max_payload)
            pull = await client.js.pull_subscribe_bind(consumer_name(agent), INTENTS_STREAM)
            await client.js.publish(intent_subject(agent), json.dumps(body).encode(), headers={MSG_ID_HEADER: intent_id})
            seen = []
            for _ in range(2):  # the NAK's 1 s delay, then the redelivery
                [msg] = await pull.fetch(1, timeout=30)
                seen.append(msg.metadata.num_delivered)
                await deliveries.handle(msg, consumer_name(agent), 30, 2)
            return seen, await client.answer_of(intent_id)

    seen, answer = asyncio.run(scenario())
    assert seen == [1, 2]
    assert answer is not None and answer["error"]["code"] == "delivery_exhausted", answer
    assert (answer["host"], answer["deliveries"], answer["intent_id"]) == ("host-x", 2, intent_id)
    assert [(e["type"], e["data"].get("delivery"), e["data"].get("ack")) for e in events] == [
        ("fleet.delivery", 1, None), ("fleet.ack", 1, "nak"),
        ("fleet.delivery", 2, None), ("fleet.ack", 2, "term")]
    assert events[1]["data"]["outcome"] == "overloaded" and events[3]["data"]["outcome"] == "delivery_exhausted"
