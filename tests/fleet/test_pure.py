"""The fleet's pure parts: names, the [fleet] section, answers and their exit codes, limits, connect options."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from covenant.errors import ConfigError
from covenant.fleet import answers
from covenant.fleet.capacity import Capacity, agent_limit
from covenant.fleet.client import FleetAgent, default_timeout_s, fleet_agents
from covenant.fleet.config import FleetConfig
from covenant.fleet.connect import connect_options
from covenant.fleet.subjects import consumer_name, intent_subject, result_subject, token, token_clashes

pytestmark = pytest.mark.xdist_group("fleet")


def test_names_are_the_ones_fleet_md_fixes() -> None:
    assert token("echo@local") == "echo_40local"
    assert consumer_name("echo@local") == "agent_echo_40local"
    assert intent_subject("sum.v2@team-a") == "covenant.intent.sum_2ev2_40team-a"
    assert token("naïve") == "na_c3_afve"  # UTF-8 bytes, each _XX
    uuid = "0f8e3c1a-5b7d-4c2e-9a1b-3d4e5f6a7b8c"
    assert result_subject(uuid) == f"covenant.result.{uuid}"  # the CLI's ids are their own token
    assert all(c not in token("a.b*c>d e@f") for c in ".*> @")


def test_two_ids_with_one_token_are_found() -> None:
    assert token("a.b@c") == token("a_2eb@c")
    assert token_clashes(["a.b@c", "a_2eb@c", "x@c"]) == {"a_2eb@c": "a.b@c"}
    assert token_clashes(["echo@local", "sum@local"]) == {}


def test_the_fleet_section_refuses_credentials_and_half_tls(tmp_path: Path) -> None:
    from covenant.config import load_config
    from covenant.home import Home

    (tmp_path / "covenant.toml").write_text('[fleet]\nservers = ["nats://alice:s3cret@10.0.0.5:4222"]\n')
    with pytest.raises(ConfigError) as bad:
        load_config(Home(tmp_path))
    assert "s3cret" not in bad.value.message and "covenant.toml:2: [fleet] servers" in bad.value.message
    assert "creds_env" in bad.value.message
    for url in ("http://10.0.0.5:4222", "nats://", "nats://host:4222/path"):
        with pytest.raises(ValidationError):
            FleetConfig(servers=(url,))
    with pytest.raises(ValidationError, match="tls_cert and tls_key go together"):
        FleetConfig(servers=("tls://n1:4222",), tls_cert="/etc/c.pem")
    with pytest.raises(ValidationError):
        FleetConfig(host="web 3")
    with pytest.raises(ValidationError):
        FleetConfig(creds_env="/etc/nats.creds")  # a path, not the name of a variable
    assert FleetConfig().enabled is False and FleetConfig(servers=("nats://n1",)).enabled
    with pytest.raises(ConfigError, match=r"covenant.toml: \[fleet\] servers is not set"):
        FleetConfig().require("/h/covenant.toml")


def test_connect_options_name_the_variable_never_the_credentials(tmp_path: Path) -> None:
    config = FleetConfig(servers=("nats://n1:4222",), creds_env="NATS_CREDS")
    with pytest.raises(ConfigError) as unset:
        connect_options(config, "t", {}, keep_trying=True)
    assert "NATS_CREDS" in unset.value.message
    with pytest.raises(ConfigError) as missing:
        connect_options(config, "t", {"NATS_CREDS": str(tmp_path / "nope.creds")}, keep_trying=True)
    assert "nope.creds" not in missing.value.message and "NATS_CREDS" in missing.value.message
    creds = tmp_path / "user.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\nsecret\n------END NATS USER JWT------\n")
    options = connect_options(config, "t", {"NATS_CREDS": str(creds)}, keep_trying=True)
    assert options["user_credentials"] == str(creds) and "secret" not in repr(options)
    assert options["max_reconnect_attempts"] == -1
    assert connect_options(FleetConfig(servers=("nats://n1",)), "t", {}, keep_trying=False)["max_reconnect_attempts"] == 1
    assert "tls" in connect_options(FleetConfig(servers=("tls://n1:4222",)), "t", {}, keep_trying=False)
    with pytest.raises(ConfigError, match="tls_ca"):
        connect_options(FleetConfig(servers=("tls://n1",), tls_ca=str(tmp_path / "none.pem")), "t", {},
                        keep_trying=False)


def test_answers_exit_as_a_local_dispatch_does() -> None:
    outcome = answers.answer({"intent_id": "i", "outcome": "timeout", "exit_code": 4, "error": "took too long"},
                             "i", "web-3", 2)
    assert (outcome["host"], outcome["deliveries"], answers.exit_code(outcome), answers.outcome_of(outcome)) == (
        "web-3", 2, 4, "timeout")
    codes = {"bad_signature": 3, "stale_intent": 3, "capability_denied": 3, "no_agent": 6, "ambiguous": 6,
             "overloaded": 5, "delivery_exhausted": 4, "bad_intent": 2, "something_new": 2}
    for code, exit_code in codes.items():
        refused = answers.refusal(code, "why", "i", "web-3", 1)
        assert refused["intent_id"] == "i" and refused["error"]["code"] == code
        assert (answers.exit_code(refused), answers.outcome_of(refused)) == (exit_code, code)
    exhausted = answers.delivery_exhausted("i", "echo@local", "web-1", 5, 5)
    assert exhausted["error"]["reason"] == "delivery_exhausted" and exhausted["error"]["outcome"] == "failed"
    assert "max_deliver 5" in exhausted["error"]["message"]


def test_an_answer_from_a_record_has_the_outcome_document_shape() -> None:
    record = {"intent_id": "i", "agent_id": "echo@local", "runtime": "python3", "outcome": "agent_error",
              "error": None, "result": {"status": "error", "text": "no", "sources": ["s"]}}
    got = answers.from_record(record, "web-2", 3)
    assert set(got) >= {"intent_id", "agent", "routed_by", "outcome", "exit_code", "status", "text", "sources", "error",
                        "decision", "record", "host", "deliveries"}
    assert (got["agent"], got["exit_code"], got["text"], got["from_record"], got["deliveries"]) == (
        "echo@local", 1, "no", True, 3)
    assert answers.from_record({**record, "outcome": "interrupted", "result": None}, "h", 2)["exit_code"] == 4


def test_limits_and_timeouts() -> None:
    assert agent_limit(8, None, 0, 16) == 8
    assert agent_limit(8, 2, 0, 16) == 2  # a Rune agent's concurrency_limit
    assert agent_limit(8, None, 3, 16) == 3  # [daemon] per_agent_concurrent
    assert agent_limit(8, 10, 0, 4) == 4  # the daemon's own max_concurrent
    assert default_timeout_s(300) == 270 and default_timeout_s(4) == 2


def test_capacity_counts_per_agent_and_leaves_room_to_others() -> None:
    async def scenario() -> None:
        capacity = Capacity()
        await capacity.set_limits({"a": 2, "b": 2})
        await capacity.set_daemon(max_concurrent=3, busy=0)
        assert await capacity.wait_room("a", 0.01)
        capacity.take("a")
        capacity.take("a")
        assert not await capacity.wait_room("a", 0.01)  # its own limit
        assert await capacity.wait_room("b", 0.01)
        capacity.take("b")
        assert not await capacity.wait_room("b", 0.01)  # the daemon's slots: 3 in all
        await capacity.set_daemon(max_concurrent=3, busy=4)  # one more busy than ours: another client's
        await capacity.release("a")
        assert not await capacity.wait_room("b", 0.01)
        await capacity.daemon_gone()
        await capacity.set_daemon(max_concurrent=8, busy=2)
        assert await capacity.wait_room("b", 0.01)
        await capacity.close()
        assert not await capacity.wait_room("b", 0.01)

    asyncio.run(scenario())


def test_the_fleet_routes_over_the_union_of_the_live_hosts_agents() -> None:
    hosts = [{"host": "h1", "agents": [{"id": "echo@local", "keywords": ["echo"]}]},
             {"host": "h2", "agents": [{"id": "echo@local", "keywords": ["repeat"]}, {"id": "sum@local", "keywords": []}]}]
    assert fleet_agents(hosts) == {"echo@local": FleetAgent("echo@local", ("echo", "repeat"), ("h1", "h2")),
                                   "sum@local": FleetAgent("sum@local", (), ("h2",))}


def test_an_answer_too_large_for_nats_is_trimmed_and_says_where_it_is_whole() -> None:
    document = answers.answer({"outcome": "ok", "exit_code": 0, "text": "x" * 5000, "sources": ["s"],
                               "record": {"result": {"text": "x" * 5000}}}, "i", "web-2", 1)
    assert answers.fit(document, 20_000) == answers.encode(document)
    import json

    without_record = json.loads(answers.fit(document, 8000))
    assert without_record["record"] is None and without_record["text"] == "x" * 5000
    assert without_record["trimmed"]["whole_on"] == "web-2"
    bare = json.loads(answers.fit(document, 2000))
    assert bare["text"] is None and bare["sources"] == [] and bare["outcome"] == "ok" and len(answers.encode(bare)) < 2000
