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
