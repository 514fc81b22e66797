"""What the fleet does when things break: a host killed mid-batch, a NATS node killed, a forged intent."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from covenant.fleet.client import FleetClient
from covenant.fleet.config import FleetConfig
from covenant.fleet.subjects import MSG_ID_HEADER, intent_subject, result_subject
from tests.fleet.conftest import Fleet, dispatch_batch, in_background, signed, wait_for

pytestmark = pytest.mark.xdist_group("fleet")


def _runs_per_host(fleet: Fleet) -> dict[str, Counter[str]]:
    """For each host, how many times each intent had an agent started there (agent.spawned)."""
    return {name: Counter(e["intent"] for e in host.audit("agent.spawned")) for name, host in fleet.hosts.items()}


def test_a_host_killed_mid_batch_loses_nothing_and_runs_nothing_twice(healthy_fleet: Fleet) -> None:
    fleet = healthy_fleet
    a = fleet.hosts["host-a"]
    texts = [f"run {i}: sleep 1.5" for i in range(16)]
    batch = in_background(lambda: dispatch_batch(fleet.servers, "slow@local", texts))
    wait_for(lambda: len(a.in_flight()) >= 2, "host-a to run intents of the batch")
    a.kill()
    answers = batch.result(timeout=180)

    assert len(answers) == 16 and [x for x in answers if x.get("outcome") != "ok"] == []
    held = {e["intent"] for e in a.audit("fleet.delivery")}  # what host-a pulled, from its durable log
    unfinished = held - {x["intent_id"] for x in answers if x["host"] == "host-a"}
    assert unfinished, "host-a was killed while it held intents"
    for answer in answers:
        if answer["intent_id"] in unfinished:
            assert answer["host"] in ("host-b", "host-c") and answer["deliveries"] >= 2, answer
    fleet.healthy()  # host-a back (its start records the intents it had in flight as interrupted)
    for name, runs in _runs_per_host(fleet).items():
        assert all(count == 1 for count in runs.values()), (name, runs.most_common(3))
    for answer in answers:
        ran_on = fleet.hosts[answer["host"]]
        assert [r["outcome"] for r in ran_on.records() if r["intent_id"] == answer["intent_id"]] == ["ok"]


def test_a_nats_node_killed_and_restarted_mid_batch(healthy_fleet: Fleet) -> None:
    fleet = healthy_fleet
    texts = [f"run {i}: sleep 1" for i in range(12)]
    batch = in_background(lambda: dispatch_batch(fleet.servers, "slow@local", texts))
    wait_for(lambda: sum(len(h.in_flight()) for h in fleet.hosts.values()) >= 2, "the batch to start")
    node = fleet.cluster.nodes[1]
    node.kill()
    wait_for(lambda: sum(len(h.in_flight()) for h in fleet.hosts.values()) >= 1, "the hosts to keep running the batch")
    fleet.cluster.restart(node)
    answers = batch.result(timeout=180)
    assert len(answers) == 12 and [x for x in answers if x.get("outcome") != "ok"] == []
    assert [x["record"]["result"]["text"] for x in answers] == ["slept 1.0"] * 12


def test_a_forged_intent_in_nats_is_refused_and_answered_as_a_denial(healthy_fleet: Fleet) -> None:
    body = signed("echo hello", "echo@local")
    body["intent"]["text"] = "echo something the issuer never signed"
    intent_id = body["intent"]["id"]

    async def publish_and_wait() -> dict:
        async with FleetClient(FleetConfig(servers=tuple(healthy_fleet.servers))) as client:
            subscription = await client.nc.subscribe(result_subject(intent_id), max_msgs=1)
            await client.js.publish(intent_subject("echo@local"), json.dumps(body).encode(),
                                    headers={MSG_ID_HEADER: intent_id})
            message = await subscription.next_msg(timeout=60)
            return json.loads(message.data)

    answer = asyncio.run(publish_and_wait())
    assert answer["error"]["code"] == "bad_signature" and answer["deliveries"] == 1, answer
    assert answer["intent_id"] == intent_id
    refusing = healthy_fleet.hosts[answer["host"]]
    decisions = [d for d in refusing.audit("policy.decision") if d.get("intent") == intent_id]
    assert [(d["allowed"], d["reason"]) for d in decisions] == [(False, "bad_signature")]
    acks = wait_for(lambda: [e for e in refusing.audit("fleet.ack") if e["intent"] == intent_id],
                    "fleet.ack (recorded once the answer is published)")
    assert [(e["outcome"], e["ack"]) for e in acks] == [("bad_signature", "term")]
    for host in healthy_fleet.hosts.values():
        assert intent_id not in {r["intent_id"] for r in host.records()}
        assert intent_id not in {e["intent"] for e in host.audit("agent.spawned")}


def test_a_copy_of_an_intent_under_another_msg_id_is_dropped_unrun(healthy_fleet: Fleet) -> None:
    """JetStream drops a duplicate by its Nats-Msg-Id: a copy of a signed intent under another one would get past
    that check (and the daemons' replay caches are per host), so the fleet drops it without running it."""
    body = signed("echo copied", "echo@local")
    intent_id = body["intent"]["id"]

    async def publish() -> None:
        async with FleetClient(FleetConfig(servers=tuple(healthy_fleet.servers))) as client:
            await client.js.publish(intent_subject("echo@local"), json.dumps(body).encode(),
                                    headers={MSG_ID_HEADER: f"{intent_id}-again"})

    asyncio.run(publish())
    wait_for(lambda: any(intent_id in h.fleet_log() and "Nats-Msg-Id is not its id" in h.fleet_log()
                         for h in healthy_fleet.hosts.values()), "a host to drop the copy")

    async def answer() -> dict | None:
        async with FleetClient(FleetConfig(servers=tuple(healthy_fleet.servers))) as client:
            return await client.answer_of(intent_id)

    assert asyncio.run(answer()) is None
    for host in healthy_fleet.hosts.values():
        assert intent_id not in {e["intent"] for e in host.audit("agent.spawned")}
        assert intent_id not in {e["intent"] for e in host.audit("fleet.delivery")}
