"""The per-replica gateway's refusals and its sessions, on its request handler (no sockets needed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.daemon.intent_context import IntentContext
from covenant.daemon.replica_gateway import ReplicaGateway
from covenant.daemon.session_keeper import SessionKeeper, SessionRefused
from covenant.rune import wire

KEY = Ed25519PrivateKey.generate()


class Calls:
    def __init__(self) -> None:
        self.made: list[str] = []

    async def model(self, intent: Any, body: dict[str, Any], on_token: Any) -> dict[str, Any]:
        self.made.append(body["intent_id"])
        return {"message": {"role": "assistant", "content": "x"}}

    async def tool(self, intent: Any, body: dict[str, Any]) -> dict[str, Any]:
        self.made.append(body["intent_id"])
        return {"ok": True, "content": 1}


def request(body: Any, target: str = "/v1/model") -> wire.Request:
    """A request as the replica makes it (the socket lets only the replica's pid in: tests/rune/test_wire.py)."""
    return wire.Request("POST", target, body, {})


async def test_only_its_intents_and_its_endpoints(tmp_path: Path) -> None:
    calls = Calls()
    gateway = ReplicaGateway("chat@local", calls, {"in-flight": object()}, SessionKeeper(tmp_path, KEY))  # type: ignore[arg-type, dict-item]
    unknown = await gateway.handle(request({"intent_id": "someone-elses", "agent": "other@local"}))
    assert isinstance(unknown, wire.JSONResponse) and unknown.status == 403
    assert unknown.document["error"]["code"] == "unknown_intent"
    bad = await gateway.handle(request(["not", "an", "object"]))
    assert isinstance(bad, wire.JSONResponse) and bad.status == 400
    elsewhere = await gateway.handle(request({"intent_id": "in-flight"}, target="/v1/admin"))
    assert isinstance(elsewhere, wire.JSONResponse) and elsewhere.status == 404
    assert calls.made == []
    ok = await gateway.handle(request({"intent_id": "in-flight"}, target="/v1/tool"))
    assert isinstance(ok, wire.JSONResponse) and ok.status == 200 and calls.made == ["in-flight"]


def _intent(intent_id: str, issuer: str, session_id: str) -> IntentContext:
    agent = SimpleNamespace(id="chat@local")
    package = SimpleNamespace(runefile=SimpleNamespace(runtime=SimpleNamespace(checkpoint_policy="on_finish")))
    return IntentContext(intent_id, issuer, agent, package, 0.0, session_id=session_id)  # type: ignore[arg-type]


async def test_the_daemon_keeps_sessions_one_intent_at_a_time_for_their_starter_only(tmp_path: Path) -> None:
    """The session an intent gets is the one the daemon gave it, held until its invoke ends, for the issuer
    who started it; the replica only appends, to the session its intent holds."""
    keeper = SessionKeeper(tmp_path, KEY)
    intents = {"i1": _intent("i1", "aa" * 32, "s1"), "i2": _intent("i2", "aa" * 32, "s1"),
               "i3": _intent("i3", "bb" * 32, "s1")}
    gateway = ReplicaGateway("chat@local", Calls(), intents, keeper)  # type: ignore[arg-type]
    early = await gateway.handle(request({"intent_id": "i2", "messages": []}, "/v1/session/append"))
    assert isinstance(early, wire.JSONResponse) and early.status == 409
    turn = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    order: list[str] = []

    async def second() -> None:
        async with keeper.held(intents["i2"]) as session:
            order.append("i2 loaded")
            assert [r["messages"] for r in session["records"]] == [turn]  # it saw the first one's turn

    async with trio.open_nursery() as nursery:
        async with keeper.held(intents["i1"]) as session:
            assert session == {"records": [], "torn_bytes": 0}
            nursery.start_soon(second)
            await trio.sleep(0.05)
            assert order == []  # the second intent of the session waits for the first
            done = await gateway.handle(request({"intent_id": "i1", "messages": turn}, "/v1/session/append"))
            assert isinstance(done, wire.JSONResponse) and done.document == {"ok": True}
            order.append("i1 done")
    assert order == ["i1 done", "i2 loaded"]

    with pytest.raises(SessionRefused) as refused:
        async with keeper.held(intents["i3"]):
            pass
    assert refused.value.code == "session_forbidden"
    path = tmp_path / "chat@local" / "s1.jsonl"
    path.write_bytes(path.read_bytes().replace(b"hello", b"HELLO"))
    with pytest.raises(SessionRefused) as corrupt:
        async with keeper.held(intents["i2"]):
            pass
    assert corrupt.value.code == "session_corrupt" and "s1.jsonl" in corrupt.value.message


async def _load(keeper: SessionKeeper, intent: IntentContext) -> list[Any]:
    async with keeper.held(intent) as session:
        assert session is not None
        return session["records"]


async def _append(keeper: SessionKeeper, intent: IntentContext, text: str) -> None:
    async with keeper.held(intent):
        await keeper.append(intent, [{"role": "user", "content": text}])


async def test_a_session_cut_back_to_an_earlier_record_is_refused_truncated(tmp_path: Path) -> None:
    """The hash chain alone accepts every prefix of itself; the signed head does not (issue 35: `sed -i '$d'`
    on a session file, and the next dispatch was ok)."""
    keeper = SessionKeeper(tmp_path, KEY)
    issuer = "aa" * 32
    for n, text in enumerate(["one", "two", "three"]):
        await _append(keeper, _intent(f"i{n}", issuer, "s1"), text)
    assert len(await _load(keeper, _intent("i3", issuer, "s1"))) == 3
    path = tmp_path / "chat@local" / "s1.jsonl"
    whole = path.read_bytes()
    path.write_bytes(b"".join(whole.splitlines(keepends=True)[:-1]))  # sed -i '$d'
    with pytest.raises(SessionRefused) as cut:
        await _load(keeper, _intent("i4", issuer, "s1"))
    assert cut.value.code == "session_corrupt" and cut.value.reason == "truncated"
    assert "(truncated)" in cut.value.message and "s1.jsonl" in cut.value.message
    path.unlink()  # the whole file gone, its head kept: the session is not silently new
    with pytest.raises(SessionRefused) as gone:
        await _load(keeper, _intent("i5", issuer, "s1"))
    assert gone.value.reason == "truncated"
    path.write_bytes(whole)  # put back as it was: loads again
    assert len(await _load(keeper, _intent("i6", issuer, "s1"))) == 3
    other = SessionKeeper(tmp_path / "elsewhere", KEY)  # another history of the same length, every hash valid
    for n, text in enumerate(["uno", "dos", "tres"]):
        await _append(other, _intent(f"o{n}", issuer, "s1"), text)
    path.write_bytes((tmp_path / "elsewhere" / "chat@local" / "s1.jsonl").read_bytes())
    with pytest.raises(SessionRefused) as replaced:
        await _load(keeper, _intent("i7", issuer, "s1"))
    assert replaced.value.reason == "edited"


async def test_a_head_of_another_history_or_key_is_refused(tmp_path: Path) -> None:
    keeper = SessionKeeper(tmp_path, KEY)
    issuer = "aa" * 32
    await _append(keeper, _intent("i1", issuer, "s1"), "one")
    await _append(keeper, _intent("i2", issuer, "s2"), "other")
    head1, head2 = tmp_path / "chat@local" / "s1.head", tmp_path / "chat@local" / "s2.head"
    saved = head1.read_bytes()
    head1.write_bytes(head2.read_bytes())  # another session's head, validly signed
    with pytest.raises(SessionRefused) as swapped:
        await _load(keeper, _intent("i3", issuer, "s1"))
    assert swapped.value.reason == "head"
    stranger = SessionKeeper(tmp_path, Ed25519PrivateKey.generate())
    head1.write_bytes(saved)
    with pytest.raises(SessionRefused) as unsigned:
        await _load(stranger, _intent("i4", issuer, "s1"))  # a head this daemon's key did not sign
    assert unsigned.value.reason == "head"
    assert len(await _load(keeper, _intent("i5", issuer, "s1"))) == 1
