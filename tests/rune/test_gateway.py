"""The per-replica gateway's refusals, on its request handler (no sockets needed for the decision)."""

from __future__ import annotations

from typing import Any

from covenant.daemon.replica_gateway import ReplicaGateway
from covenant.rune import wire


class Calls:
    def __init__(self) -> None:
        self.made: list[str] = []

    async def model(self, intent: Any, body: dict[str, Any], on_token: Any) -> dict[str, Any]:
        self.made.append(body["intent_id"])
        return {"message": {"role": "assistant", "content": "x"}}

    async def tool(self, intent: Any, body: dict[str, Any]) -> dict[str, Any]:
        self.made.append(body["intent_id"])
        return {"ok": True, "content": 1}


def request(body: Any, pid: int | None, target: str = "/v1/model") -> wire.Request:
    return wire.Request("POST", target, body, {}, peer_pid=pid)


async def test_only_the_replica_pid_and_only_its_intents() -> None:
    calls = Calls()
    gateway = ReplicaGateway("chat@local", calls, {"in-flight": object()}, lambda: 4242)  # type: ignore[arg-type, dict-item]
    refused = await gateway.handle(request({"intent_id": "in-flight"}, pid=4243))
    assert isinstance(refused, wire.JSONResponse) and refused.status == 403
    assert refused.document["error"]["code"] == "forbidden"
    unknown = await gateway.handle(request({"intent_id": "someone-elses", "agent": "other@local"}, pid=4242))
    assert isinstance(unknown, wire.JSONResponse) and unknown.status == 403
    assert unknown.document["error"]["code"] == "unknown_intent"
    bad = await gateway.handle(request(["not", "an", "object"], pid=4242))
    assert isinstance(bad, wire.JSONResponse) and bad.status == 400
    elsewhere = await gateway.handle(request({"intent_id": "in-flight"}, pid=4242, target="/v1/admin"))
    assert isinstance(elsewhere, wire.JSONResponse) and elsewhere.status == 404
    assert calls.made == []
    ok = await gateway.handle(request({"intent_id": "in-flight"}, pid=4242, target="/v1/tool"))
    assert isinstance(ok, wire.JSONResponse) and ok.status == 200 and calls.made == ["in-flight"]


async def test_a_stopped_replica_serves_nobody() -> None:
    calls = Calls()
    gateway = ReplicaGateway("chat@local", calls, {"in-flight": object()}, lambda: None)  # type: ignore[arg-type, dict-item]
    refused = await gateway.handle(request({"intent_id": "in-flight"}, pid=4242))
    assert isinstance(refused, wire.JSONResponse) and refused.status == 403 and calls.made == []
