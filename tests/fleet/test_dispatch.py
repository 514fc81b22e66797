"""Dispatch over the fleet: spread over the hosts that run the agent, all answered; routing like a daemon's."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fleet.conftest import Fleet, dispatch_batch, fleet_status, wait_for

pytestmark = pytest.mark.xdist_group("fleet")


def test_dispatches_spread_over_the_hosts_and_all_answer(healthy_fleet: Fleet) -> None:
    a = healthy_fleet.hosts["host-a"]
    with ThreadPoolExecutor(6) as pool:
        runs = list(pool.map(lambda i: a.cli("dispatch", "--fleet", "--json", "--agent", "slow", f"run {i}: sleep 0.5"),
                             range(12)))
    answers = [json.loads(r.stdout) for r in runs]
    assert [r.returncode for r in runs] == [0] * 12, [r.stderr for r in runs]
    assert all(x["outcome"] == "ok" and x["agent"] == "slow@local" and x["deliveries"] == 1 for x in answers)
    by_host = {x["host"] for x in answers}
    assert len(by_host) >= 2, by_host
    for answer in answers:
        ran_on = healthy_fleet.hosts[answer["host"]]
        assert answer["intent_id"] in {r["intent_id"] for r in ran_on.records()}


def test_an_agent_of_one_host_is_reached_from_a_home_without_it(healthy_fleet: Fleet) -> None:
    a = healthy_fleet.hosts["host-a"]
    assert not (a.home / "agents" / "onlyc").exists()
    by_name = a.cli("dispatch", "--fleet", "--json", "--agent", "onlyc", "hello from a")
    by_keyword = a.cli("dispatch", "--fleet", "--json", "only this one, please")
    for run in (by_name, by_keyword):
        assert run.returncode == 0, run.stderr
        answer = json.loads(run.stdout)
        assert (answer["host"], answer["agent"], answer["outcome"]) == ("host-c", "onlyc@local", "ok")
    assert json.loads(by_keyword.stdout)["text"] == "only this one, please"
    text = a.cli("dispatch", "--fleet", "--agent", "onlyc@local", "plain text out")
    assert (text.returncode, text.stdout) == (0, "plain text out\n")


def test_routing_over_the_fleet_follows_the_daemon_rules(healthy_fleet: Fleet) -> None:
    a = healthy_fleet.hosts["host-a"]
    tie = a.cli("dispatch", "--fleet", "echo and sleep 0")
    assert tie.returncode == 6 and "echo@local" in tie.stderr and "slow@local" in tie.stderr, tie.stderr
    nothing = a.cli("dispatch", "--fleet", "no keyword of any agent here")
    assert nothing.returncode == 6 and "default_agent" in nothing.stderr, nothing.stderr
    partial = a.cli("dispatch", "--fleet", "echoes are not a whole word")
    assert partial.returncode == 6, partial.stderr


def test_an_agent_no_live_host_runs_exits_5_naming_it(healthy_fleet: Fleet) -> None:
    run = healthy_fleet.hosts["host-b"].cli("dispatch", "--fleet", "--agent", "nowhere@local", "anyone?")
    assert run.returncode == 5 and "nowhere@local" in run.stderr and "no live host" in run.stderr, run.stderr


def test_the_host_that_ran_it_audits_the_delivery_and_the_ack(healthy_fleet: Fleet) -> None:
    run = healthy_fleet.hosts["host-a"].cli("dispatch", "--fleet", "--json", "--agent", "echo", "audited")
    answer = json.loads(run.stdout)
    host = healthy_fleet.hosts[answer["host"]]
    deliveries = [e for e in host.audit("fleet.delivery") if e["intent"] == answer["intent_id"]]
    assert deliveries == [{"intent": answer["intent_id"], "delivery": 1, "consumer": "agent_echo_40local",
                           "host": answer["host"]}]
    acks = wait_for(lambda: [e for e in host.audit("fleet.ack") if e["intent"] == answer["intent_id"]],
                    "fleet.ack (recorded once the answer is published)")
    assert acks == [{"intent": answer["intent_id"], "outcome": "ok", "delivery": 1, "ack": "ack"}]
    from covenant.audit.reader import Entry, iter_records

    mine = [e.record for e in iter_records(host.home / "audit")
            if isinstance(e, Entry) and e.record["data"].get("intent") == answer["intent_id"]]
    order = [record["type"] for record in mine]
    assert order[0] == "fleet.delivery" and order[-1] == "fleet.ack" and "intent.completed" in order, order
    # The delivery is written in the intent's own first commit: right before its intent.received.
    assert order[:3] == ["fleet.delivery", "intent.received", "policy.decision"] and mine[1]["seq"] == mine[0]["seq"] + 1
    for other in healthy_fleet.hosts.values():
        if other is not host:
            assert answer["intent_id"] not in {e["intent"] for e in other.audit("fleet.delivery")}


def test_fleet_show_and_status(healthy_fleet: Fleet) -> None:
    b = healthy_fleet.hosts["host-b"]
    answer = json.loads(b.cli("dispatch", "--fleet", "--json", "--agent", "echo", "show me").stdout)
    shown = b.cli("fleet", "show", "--json", answer["intent_id"])
    assert shown.returncode == 0 and json.loads(shown.stdout) == answer
    human = b.cli("fleet", "show", answer["intent_id"])
    assert human.returncode == 0 and answer["host"] in human.stdout and "show me" in human.stdout
    missing = b.cli("fleet", "show", "no-such-intent")
    assert missing.returncode == 1 and "no answer" in missing.stderr

    status = json.loads(b.cli("fleet", "status", "--json").stdout)
    up = {h["host"]: h for h in status["hosts"] if h["up"]}
    assert set(up) >= {"host-a", "host-b", "host-c"}
    assert {a["id"] for a in up["host-c"]["agents"]} == {"echo@local", "slow@local", "onlyc@local"}
    assert all(isinstance(up[h]["audit_head"]["seq"], int) and up[h]["grants_digest"] for h in up)
    queues = {q["agent"]: q for q in status["agents"]}
    assert queues["onlyc@local"]["hosts"] == ["host-c"] and queues["echo@local"]["pending"] == 0
    text = b.cli("fleet", "status")
    assert text.returncode == 0 and "host-c" in text.stdout and "onlyc@local" in text.stdout


def test_without_fleet_config_or_nats_the_cli_says_what_to_do(healthy_fleet: Fleet, tmp_path: Path) -> None:
    from tests.fleet.nats_cluster import free_ports

    host = healthy_fleet.hosts["host-a"]
    env = {**host.daemon.env, "COVENANT_HOME": str(tmp_path / "home")}
    assert host.daemon.cli("init", env=env).returncode == 0
    unset = host.daemon.cli("dispatch", "--fleet", "--agent", "echo", "x", env=env)
    assert unset.returncode == 2 and "[fleet] servers" in unset.stderr, unset.stderr
    (tmp_path / "home" / "covenant.toml").write_text(f'[fleet]\nservers = ["nats://127.0.0.1:{free_ports(1)[0]}"]\n')
    for args in (("dispatch", "--fleet", "--agent", "echo", "x"), ("fleet", "status"), ("fleet", "show", "x")):
        down = host.daemon.cli(*args, env=env)
        assert down.returncode == 5 and "NATS" in down.stderr, (args, down.stderr)
    timeout = host.cli("dispatch", "--timeout", "5", "--agent", "echo", "x")
    assert timeout.returncode == 2 and "--fleet" in timeout.stderr


def test_plain_dispatch_never_loads_nats(healthy_fleet: Fleet) -> None:
    host = healthy_fleet.hosts["host-a"]
    done = subprocess.run([sys.executable, "-X", "importtime", str(Path(sys.executable).parent / "covenant"),
                           "dispatch", "--agent", "echo", "local"], env=host.daemon.env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0]
                for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & {"nats", "asyncio", "pydantic"}, imported & {"nats", "asyncio", "pydantic"}


def test_an_answer_larger_than_nats_takes_comes_without_its_record(healthy_fleet: Fleet) -> None:
    [answer] = dispatch_batch(healthy_fleet.servers, "big@local", ["answer 700000"])  # text + record: 1.4 MB
    assert answer["outcome"] == "ok" and answer["text"] == "x" * 700_000 and answer["record"] is None
    assert answer["trimmed"]["whole_on"] == "host-b" and answer["trimmed"]["bytes"] > 1_048_576
    record = healthy_fleet.hosts["host-b"].daemon.api("GET", f"/v1/dispatches/{answer['intent_id']}")
    assert isinstance(record, dict) and record["result"]["text"] == "x" * 700_000


def test_the_fleet_process_waits_for_nats_and_stops_at_once_without_it(healthy_fleet: Fleet, tmp_path: Path) -> None:
    import signal

    from tests.fleet.nats_cluster import free_ports

    host = healthy_fleet.hosts["host-a"]
    env = {**host.daemon.env, "COVENANT_HOME": str(tmp_path / "home"), "COVENANT_SOCKET": str(tmp_path / "none.sock")}
    assert host.daemon.cli("init", env=env).returncode == 0
    (tmp_path / "home" / "covenant.toml").write_text(f'[fleet]\nservers = ["nats://127.0.0.1:{free_ports(1)[0]}"]\n')
    process = subprocess.Popen([sys.executable, "-m", "covenant", "fleet"], env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    lines = [process.stderr.readline() for _ in range(2)]  # "starting", then the first failed attempt
    assert "fleet process starting" in lines[0] and "NATS connection problem" in lines[1], lines
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert "stopped before NATS answered" in process.stderr.read()


def test_fleet_status_shows_grants_drifting_between_hosts(healthy_fleet: Fleet) -> None:
    a = healthy_fleet.hosts["host-a"]
    issuer = "ab" * 32

    def drift() -> bool:
        return fleet_status(healthy_fleet.servers)["drift"]["grants_digest"]

    assert not drift()
    assert a.cli("grant", issuer, "tool.web_fetch").returncode == 0
    try:
        wait_for(drift, "host-a's grants digest to differ from the others'")
        text = a.cli("fleet", "status")
        assert "drift: the hosts' grants differ" in text.stdout, text.stdout
    finally:
        assert a.cli("revoke", issuer, "tool.web_fetch").returncode == 0
    wait_for(lambda: not drift(), "the digests to agree again once the grant is revoked")
