"""One host's fleet process over its life: killed, stopped, reloaded; stale and exhausted intents.

A fourth host, ``host-d``, joins the shared fleet for this module: its agents run nowhere else,
so what happens to their intents is what host-d (or the fleet's answer to its death) does.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from covenant.fleet.client import FleetClient
from covenant.fleet.config import FleetConfig
from covenant.fleet.subjects import INTENTS_STREAM, consumer_name, intent_subject
from tests.fleet.conftest import (
    Fleet,
    FleetHost,
    add_agent,
    dispatch_batch,
    fleet_status,
    in_background,
    make_host,
    signed,
    wait_fleet,
    wait_for,
)

pytestmark = pytest.mark.xdist_group("fleet")

EXHAUST_ACK_WAIT_S = 2


def _create_consumer(servers: list[str], agent: str, ack_wait_s: int, max_deliver: int) -> None:
    """The agent's consumer as another host (or an operator) made it: its settings are the ones that count."""
    from nats.js.api import AckPolicy, ConsumerConfig

    async def create() -> None:
        async with FleetClient(FleetConfig(servers=tuple(servers))) as client:
            name = consumer_name(agent)
            await client.js.add_consumer(INTENTS_STREAM, ConsumerConfig(
                name=name, durable_name=name, filter_subject=intent_subject(agent), ack_policy=AckPolicy.EXPLICIT,
                ack_wait=ack_wait_s, max_deliver=max_deliver))

    asyncio.run(create())


@pytest.fixture(scope="module")
def host_d(fleet: Fleet) -> Iterator[FleetHost]:
    _create_consumer(fleet.servers, "exhaust@local", EXHAUST_ACK_WAIT_S, 1)
    host = make_host("host-d", fleet.servers, {"lonely": ("slow.py", ()), "exhaust": ("slow.py", ())})
    try:
        host.start()
        wait_fleet(fleet.servers, {"host-d": {"lonely@local", "exhaust@local"}})
        yield host
    finally:
        host.stop()
        shutil.rmtree(host.base, ignore_errors=True)


@pytest.fixture
def d(host_d: FleetHost, healthy_fleet: Fleet) -> Iterator[FleetHost]:
    """host-d up before and after the test."""
    yield host_d
    if not host_d.alive:
        host_d.kill()
        host_d.start()
    wait_fleet(healthy_fleet.servers, {"host-d": {"lonely@local", "exhaust@local"}})


def _one(servers: list[str], body: dict[str, Any], agent: str, timeout: float = 120) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async with FleetClient(FleetConfig(servers=tuple(servers))) as client:
            return await client.dispatch(body, agent, timeout)

    return asyncio.run(run())


def test_a_redelivery_of_an_intent_this_host_ran_is_answered_from_its_record(d: FleetHost, fleet: Fleet) -> None:
    body = signed("lonely: sleep 2", "lonely@local")
    intent_id = body["intent"]["id"]
    answer = in_background(lambda: _one(fleet.servers, body, "lonely@local"))
    wait_for(lambda: intent_id in d.in_flight(), "host-d to run the intent")
    assert d.fleet is not None
    d.fleet.send_signal(signal.SIGKILL)  # the fleet process dies, its daemon runs the intent to its end
    d.fleet.wait()
    wait_for(lambda: intent_id in {r["intent_id"] for r in d.records()}, "the daemon to finish the intent")
    d.start_fleet()
    got = answer.result(timeout=120)
    assert (got["host"], got["deliveries"], got["from_record"], got["outcome"]) == ("host-d", 2, True, "ok"), got
    assert got["text"] == "slept 2.0"
    assert [e["intent"] for e in d.audit("agent.spawned")].count(intent_id) == 1
    assert [e["delivery"] for e in d.audit("fleet.delivery") if e["intent"] == intent_id] == [1, 2]
    acks = wait_for(lambda: [(e["outcome"], e["ack"], e["delivery"]) for e in d.audit("fleet.ack")
                             if e["intent"] == intent_id], "fleet.ack (recorded once the answer is published)")
    assert acks == [("ok", "ack", 2)]


def test_an_intent_no_host_finishes_is_answered_delivery_exhausted(d: FleetHost, fleet: Fleet) -> None:
    cli = fleet.hosts["host-a"].daemon.cli_background("dispatch", "--fleet", "--json", "--agent", "exhaust",
                                                      "exhaust: sleep 3")
    wait_for(lambda: d.in_flight(), "host-d to run the intent")
    d.kill()  # its one delivery (max_deliver 1) is never acknowledged
    d.start()  # JetStream gives up on it when the agent is pulled for again past ack_wait, and says so
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 4, err
    answer = json.loads(out)
    assert answer["error"]["code"] == "delivery_exhausted" and answer["error"]["reason"] == "delivery_exhausted"
    assert answer["host"] in ("host-a", "host-b", "host-c", "host-d") and answer["deliveries"] == 1, answer
    assert json.loads(fleet.hosts["host-b"].cli("fleet", "show", "--json", answer["error"]["intent"]).stdout) == answer


def test_sigterm_finishes_what_runs_and_leaves_the_fleet(d: FleetHost, fleet: Fleet) -> None:
    body = signed("lonely: sleep 2", "lonely@local")
    intent_id = body["intent"]["id"]
    answer = in_background(lambda: _one(fleet.servers, body, "lonely@local"))
    wait_for(lambda: intent_id in d.in_flight(), "host-d to run the intent")
    assert d.stop_fleet(signal.SIGTERM) == 0
    got = answer.result(timeout=60)
    assert (got["host"], got["deliveries"], got["outcome"]) == ("host-d", 1, "ok"), got
    hosts = {h["host"]: h for h in fleet_status(fleet.servers)["hosts"]}
    assert hosts["host-d"]["up"] is False and type(hosts["host-d"]["last_seen_ms"]) is int  # its last audit head
    assert "fleet process stopped" in d.fleet_log()
    d.start_fleet()


def test_a_reload_adds_and_drops_the_agents_the_host_pulls_for(d: FleetHost, fleet: Fleet) -> None:
    add_agent(d.daemon, "late", "echo.py", ("tardy",))
    assert d.cli("reload").returncode == 0
    wait_fleet(fleet.servers, {"host-d": {"late@local"}})
    run = fleet.hosts["host-a"].cli("dispatch", "--fleet", "--json", "tardy but here")
    assert run.returncode == 0, run.stderr
    assert (json.loads(run.stdout)["host"], json.loads(run.stdout)["agent"]) == ("host-d", "late@local")
    shutil.rmtree(d.home / "agents" / "late")
    assert d.cli("reload").returncode == 0

    def dropped() -> bool:
        hosts = {h["host"]: h for h in fleet_status(fleet.servers)["hosts"] if h["up"]}
        return "host-d" in hosts and "late@local" not in {a["id"] for a in hosts["host-d"]["agents"]}

    wait_for(dropped, "host-d to drop late@local from its entry")
    gone = fleet.hosts["host-a"].cli("dispatch", "--fleet", "--agent", "late", "anyone?")
    assert gone.returncode == 5 and "late" in gone.stderr


@pytest.fixture
def host_s(fleet: Fleet) -> Iterator[FleetHost]:
    """A host whose daemon accepts 2 s of clock skew, one intent at a time."""
    host = make_host("host-s", fleet.servers, {"stale": ("slow.py", ())}, fleet_extra={"max_in_flight": 1},
                     config="[policy]\nskew_s = 2\n")
    yield host
    host.stop()
    shutil.rmtree(host.base, ignore_errors=True)


def test_an_intent_that_waited_past_skew_s_is_answered_stale(fleet: Fleet, host_s: FleetHost) -> None:
    host = host_s
    host.start()
    wait_fleet(fleet.servers, {"host-s": {"stale@local"}})
    answers = dispatch_batch(fleet.servers, "stale@local", ["first: sleep 3", "second: sleep 3"], timeout=120)
    host.stop()  # everything it did is in its log now
    outcomes = sorted((a.get("outcome") or a["error"]["code"]) for a in answers)
    assert outcomes == ["ok", "stale_intent"], answers
    stale = next(a for a in answers if isinstance(a.get("error"), dict))
    assert stale["host"] == "host-s" and stale["deliveries"] == 1 and "skew" in stale["error"]["message"], stale
    acks = [(e["outcome"], e["ack"]) for e in host.audit("fleet.ack") if e["intent"] == stale["intent_id"]]
    assert acks == [("stale_intent", "term")]
    assert stale["intent_id"] not in {e["intent"] for e in host.audit("agent.spawned")}


def test_a_log_cut_back_after_its_head_left_the_host_fails_verify_fleet(d: FleetHost, fleet: Fleet) -> None:
    from covenant.fleet.heads import fetch_heads

    audit = d.home / "audit"
    old_head = json.loads((audit / "head.json").read_text())
    run = fleet.hosts["host-a"].cli("dispatch", "--fleet", "--agent", "lonely", "lonely: sleep 0")
    assert run.returncode == 0, run.stderr
    assert d.stop_fleet() == 0  # its last audit head leaves the host on the way out
    d.daemon.stop()

    async def heads() -> list[dict[str, Any]]:
        async with FleetClient(FleetConfig(servers=tuple(fleet.servers))) as client:
            return await fetch_heads(client.js, "host-d")

    later = sorted(h["seq"] for h in asyncio.run(heads()) if h["seq"] > old_head["seq"])
    assert later, "the fleet holds a head newer than the one the log is cut back to"
    backup = d.base / "audit-backup"
    shutil.copytree(audit, backup)
    try:
        segment = audit / old_head["segment"]
        data = segment.read_bytes()
        end = 0
        for line in data.splitlines(keepends=True):
            end += len(line)
            if json.loads(line)["seq"] == old_head["checkpoint_seq"]:
                break
        segment.write_bytes(data[:end])  # a careful attacker: back to a checkpoint, with its head.json
        (audit / "head.json").write_text(json.dumps(old_head))

        assert d.cli("audit", "verify").returncode == 0  # the log alone cannot tell
        caught = d.cli("audit", "verify", "--fleet")
        assert caught.returncode == 1 and f"FAILED: fleet, seq {later[0]}:" in caught.stdout, caught.stdout
        assert "cut back" in caught.stdout
        report = json.loads(d.cli("audit", "verify", "--fleet", "--json").stdout)
        assert not report["ok"] and report["fleet"]["problem"]["seq"] == later[0]
    finally:
        shutil.rmtree(audit)
        shutil.move(backup, audit)
    d.start()
    assert d.cli("audit", "verify", "--fleet").returncode == 0
