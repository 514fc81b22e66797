"""The fleet as the audit log's witness, and the fleet events a daemon records for its fleet process."""

from __future__ import annotations

import json

import pytest

from covenant.client import RemoteError
from tests.fleet.conftest import Fleet

pytestmark = pytest.mark.xdist_group("fleet")


def test_audit_verify_fleet_passes_on_every_host(healthy_fleet: Fleet) -> None:
    for name, host in healthy_fleet.hosts.items():
        run = host.cli("audit", "verify", "--fleet")
        assert run.returncode == 0, (name, run.stdout, run.stderr)
        assert "head(s) this host published to the fleet" in run.stdout, run.stdout
        report = json.loads(host.cli("audit", "verify", "--fleet", "--json").stdout)
        assert report["ok"] and report["fleet"]["ok"] and report["fleet"]["heads"] >= 1, report
        assert report["fleet"]["newest_seq"] <= report["last_checkpoint"]["seq"]


def test_the_daemon_records_exactly_the_documented_fleet_events(healthy_fleet: Fleet) -> None:
    daemon = healthy_fleet.hosts["host-a"].daemon
    good = {"intent": "i-1", "delivery": 2, "consumer": "agent_echo_40local", "host": "host-a"}
    answer = daemon.api("POST", "/v1/fleet/events", {"type": "fleet.delivery", "data": good})
    assert isinstance(answer, dict) and type(answer["seq"]) is int
    assert good in healthy_fleet.hosts["host-a"].audit("fleet.delivery")
    for body in (
        {"type": "intent.completed", "data": good},  # only the fleet's own events
        {"type": "fleet.delivery", "data": {**good, "extra": 1}},
        {"type": "fleet.delivery", "data": {k: v for k, v in good.items() if k != "host"}},
        {"type": "fleet.delivery", "data": {**good, "delivery": 1.5}},
        {"type": "fleet.delivery", "data": {**good, "delivery": 0}},
        {"type": "fleet.ack", "data": {"intent": "i-1", "outcome": "ok", "delivery": 1, "ack": "maybe"}},
    ):
        with pytest.raises(RemoteError) as refused:
            daemon.api("POST", "/v1/fleet/events", body)
        assert (refused.value.code, refused.value.http_status) == ("bad_request", 400), body


def test_a_forwarded_delivery_is_written_with_the_intents_first_events_even_when_it_is_refused(
    healthy_fleet: Fleet,
) -> None:
    """``fleet`` beside the signed intent in POST /v1/dispatch: fleet.delivery goes into the intent's own
    first commit — before its policy.decision when the signature is bad — and a malformed one is 400."""
    from covenant.audit.reader import Entry, iter_records
    from tests.fleet.conftest import signed

    host = healthy_fleet.hosts["host-a"]
    body = signed("forged", "echo@local")
    body["intent"]["text"] = "altered after signing"
    delivery = {"delivery": 1, "consumer": "agent_echo_40local", "host": "host-a"}
    with pytest.raises(RemoteError) as refused:
        host.daemon.api("POST", "/v1/dispatch", {**body, "fleet": delivery})
    assert refused.value.code == "bad_signature"
    mine = [e.record for e in iter_records(host.home / "audit")
            if isinstance(e, Entry) and e.record["data"].get("intent") == body["intent"]["id"]]
    assert [r["type"] for r in mine] == ["fleet.delivery", "policy.decision"]
    assert mine[0]["data"] == {"intent": body["intent"]["id"], **delivery} and mine[1]["seq"] == mine[0]["seq"] + 1
    for bad in ({**delivery, "extra": 1}, {**delivery, "delivery": 0}, "not an object"):
        with pytest.raises(RemoteError) as malformed:
            host.daemon.api("POST", "/v1/dispatch", {**signed("x", "echo@local"), "fleet": bad})
        assert (malformed.value.code, malformed.value.http_status) == ("bad_request", 400), bad
