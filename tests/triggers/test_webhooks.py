"""Signed webhooks in a real daemon: accepted, replayed (also after a restart), mis-signed, stale,
rate-limited, oversized; the secret never reaches the audit log or the daemon's log."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from covenant.audit.recent import records_since
from covenant.triggers.webhooks import signature_header
from tests.daemon.conftest import DaemonProcess

SECRET = "whsec-3c1e9a-never-logged"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup(daemon: DaemonProcess, marks: Path, port: int, extra: str = "") -> None:
    marks.mkdir()
    os.chmod(marks, 0o777)
    daemon.add_agent("mark", "mark.py")
    daemon.env["HOOK_SECRET"] = SECRET
    daemon.write_config(f"""
        [webhooks]
        listen = "127.0.0.1:{port}"
        skew_s = 60
        max_body_kb = 1
        {extra}

        [[webhooks.routes]]
        path = "/hooks/mark"
        agent = "mark@local"
        issuer = "tester@test"
        secret_env = "HOOK_SECRET"
        rate = "3/minute"
    """)


def _post(port: int, body: bytes, header: str | None) -> httpx.Response:
    headers = {"content-type": "text/plain"}
    if header is not None:
        headers["Covenant-Signature"] = header
    return httpx.post(f"http://127.0.0.1:{port}/hooks/mark", content=body, headers=headers, timeout=120)


def _refused_counts(daemon: DaemonProcess) -> dict[tuple[str, str], float]:
    """``covenant_http_refused_total`` by (listener, code), from the daemon's GET /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    from covenant.client import DaemonClient

    with DaemonClient(daemon.socket, timeout=60) as client:
        text = client._send("GET", "/metrics").read().decode()
    return {(s.labels["listener"], s.labels["code"]): s.value
            for family in text_string_to_metric_families(text) if family.name == "covenant_http_refused"
            for s in family.samples if s.name.endswith("_total")}


def _requests(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return [r["data"] for r in records_since(daemon.home / "audit", 0, frozenset({"webhook.request"}))[::-1]]


def test_webhook_accept_replay_restart_bad_stale_rate_and_size(daemon: DaemonProcess) -> None:
    marks = daemon.home.parent / "marks"
    port = _free_port()
    _setup(daemon, marks, port)
    daemon.start()
    body = f"mark {marks}".encode()
    good = signature_header(SECRET.encode(), int(time.time()), body)

    accepted = _post(port, body, good)
    assert accepted.status_code == 200, accepted.text
    outcome = accepted.json()
    # The outcome, the text and the intent id only: never the record's argv, paths, pid or uid.
    assert set(outcome) == {"intent_id", "outcome", "text"} and outcome["outcome"] == "ok", outcome
    assert str(marks) not in accepted.text and "mark.py" not in accepted.text
    assert [p.name for p in marks.iterdir()] == [outcome["intent_id"]]

    replay = _post(port, body, good)
    assert (replay.status_code, replay.json()["error"]["code"]) == (409, "replayed_signature")

    forged = signature_header(b"not-the-secret", int(time.time()), body)
    assert (_post(port, body, forged).status_code, _post(port, body, forged).json()["error"]["code"]) == (401, "bad_signature")
    tampered = _post(port, body + b"!", signature_header(SECRET.encode(), int(time.time()) + 1, body))
    assert (tampered.status_code, tampered.json()["error"]["code"]) == (401, "bad_signature")
    assert _post(port, body, None).json()["error"]["code"] == "bad_signature"

    stale = _post(port, body, signature_header(SECRET.encode(), int(time.time()) - 600, body))
    assert (stale.status_code, stale.json()["error"]["code"]) == (401, "stale_signature")

    big = b"x" * 2048
    oversized = _post(port, big, signature_header(SECRET.encode(), int(time.time()), big))
    assert (oversized.status_code, oversized.json()["error"]["code"]) == (413, "body_too_large")

    as_json = json.dumps({"text": f"mark {marks}"}).encode()
    second = _post(port, as_json, signature_header(SECRET.encode(), int(time.time()) + 2, as_json))
    assert second.status_code == 200, second.text
    third = _post(port, body, signature_header(SECRET.encode(), int(time.time()) + 3, body))
    assert third.status_code == 200, third.text
    limited = _post(port, body, signature_header(SECRET.encode(), int(time.time()) + 4, body))
    assert (limited.status_code, limited.json()["error"]["code"]) == (429, "rate_limited")
    # A wrong signature is refused before the rate is consulted.
    assert _post(port, body, forged).json()["error"]["code"] == "bad_signature"
    assert len(list(marks.iterdir())) == 3
    refused = _refused_counts(daemon)
    assert {code: n for (listener, code), n in refused.items() if listener == "webhooks"} == {
        "401": 6, "409": 1, "413": 1, "429": 1}
    status = daemon.cli("status", check=True).stdout
    assert f"webhooks   listening on 127.0.0.1:{port}, 1 route" in status, status

    assert daemon.stop() == 0
    daemon.start()
    after = _post(port, body, good)
    assert (after.status_code, after.json()["error"]["code"]) == (409, "replayed_signature")
    assert daemon.stop() == 0
    assert len(list(marks.iterdir())) == 3

    outcomes = [r["outcome"] for r in _requests(daemon)]
    assert outcomes == ["accepted", "replayed_signature", "bad_signature", "bad_signature", "bad_signature",
                        "bad_signature", "stale_signature", "body_too_large", "accepted", "accepted",
                        "rate_limited", "bad_signature", "replayed_signature"]
    assert all(r["route"] == "/hooks/mark" for r in _requests(daemon))
    for audit_file in (daemon.home / "audit").iterdir():
        assert SECRET.encode() not in audit_file.read_bytes()
    assert SECRET not in daemon.log()


def test_refusals_beyond_the_per_minute_cap_are_answered_but_not_recorded(daemon: DaemonProcess) -> None:
    port = _free_port()
    _setup(daemon, daemon.home.parent / "marks", port, extra="audit_refusals_per_minute = 2")
    daemon.start()
    forged = signature_header(b"not-the-secret", int(time.time()), b"x")
    answers = [_post(port, b"x", forged).status_code for _ in range(6)]
    strangers = [httpx.post(f"http://127.0.0.1:{port}/probe/{n}", content=b"x", timeout=120).status_code
                 for n in range(5)]
    good = _post(port, b"hello", signature_header(SECRET.encode(), int(time.time()), b"hello"))
    assert daemon.stop() == 0

    assert answers == [401] * 6 and strangers == [404] * 5
    assert good.status_code == 200, good.text
    recorded = _requests(daemon)
    assert [(r["route"], r["outcome"], r.get("suppressed")) for r in recorded] == [
        ("/hooks/mark", "bad_signature", 0), ("/hooks/mark", "bad_signature", 0),
        ("/probe/0", "no_route", 0), ("/probe/1", "no_route", 0), ("/hooks/mark", "accepted", None)]


def test_webhooks_are_off_by_default(daemon: DaemonProcess) -> None:
    daemon.start()
    listening = {c.laddr.port for c in __import__("psutil").Process(daemon.process.pid).net_connections("tcp")}
    assert daemon.stop() == 0
    assert listening == set()


def test_a_route_whose_secret_variable_is_unset_stops_the_daemon(daemon: DaemonProcess) -> None:
    marks = daemon.home.parent / "marks"
    _setup(daemon, marks, _free_port())
    del daemon.env["HOOK_SECRET"]
    process = daemon.cli_background("daemon")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "/hooks/mark" in err and "HOOK_SECRET" in err and SECRET not in err
