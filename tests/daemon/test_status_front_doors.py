"""`covenant status` shows the ways in besides the control socket (webhooks, A2A, schedules, fleet), names in
covenant.toml that lead to no agent (also logged at start and after each reload) and home files whose mode is
too wide; what the A2A listener refuses is counted in /metrics. One real daemon serves every check."""

from __future__ import annotations

import json
import os
import socket
import time

import httpx

from covenant.client import DaemonClient
from tests.a2a.conftest import free_port
from tests.daemon.conftest import DaemonProcess

TOKEN = "tok-front-doors-0123456789abcdef"
WARNING = "a name in covenant.toml leads to no agent"


def _status_as_fleet(daemon: DaemonProcess) -> int:
    """GET /v1/status as `covenant fleet` sends it (its Covenant-Client header); returns the HTTP status."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(str(daemon.socket))
        sock.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\nCovenant-Client: fleet\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _metrics(daemon: DaemonProcess) -> str:
    with DaemonClient(daemon.socket) as client:
        return client._send("GET", "/metrics").read().decode()


def test_status_shows_listeners_schedules_fleet_unknown_names_and_file_modes(daemon: DaemonProcess) -> None:
    hook_port, a2a_port = free_port(), free_port()
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.env["HOOK_SECRET"] = "whsec-front-doors"
    daemon.env["A2A_FRONT_TOKEN"] = TOKEN
    daemon.write_config(f"""
        [webhooks]
        listen = "127.0.0.1:{hook_port}"

        [[webhooks.routes]]
        path = "/hooks/echo"
        agent = "echo@local"
        issuer = "tester@test"
        secret_env = "HOOK_SECRET"

        [[webhooks.routes]]
        path = "/hooks/ghost"
        agent = "ghost"
        issuer = "tester@test"
        secret_env = "HOOK_SECRET"

        [a2a]
        listen = "127.0.0.1:{a2a_port}"
        expose = ["echo", "phantom"]
        max_body_kb = 4

        [[a2a.clients]]
        name = "partner"
        issuer = "tester@test"
        token_env = "A2A_FRONT_TOKEN"

        [[schedules]]
        name = "hourly"
        agent = "echo@local"
        input = "echo tick"
        every = "1h"
        issuer = "tester@test"

        [[schedules]]
        name = "orphan"
        agent = "missing@local"
        every = "2h"
        issuer = "tester@test"

        [fleet]
        servers = ["nats://127.0.0.1:4222"]
        host = "web-1"
    """)
    daemon.start()
    started = time.time() * 1000

    doc = json.loads(daemon.cli("status", "--json", check=True).stdout)
    assert doc["webhooks"] == {"listen": f"127.0.0.1:{hook_port}", "routes": [
        {"path": "/hooks/echo", "agent": "echo@local"}, {"path": "/hooks/ghost", "agent": "ghost"}]}
    assert doc["a2a"] == {"listen": f"127.0.0.1:{a2a_port}", "url": f"http://127.0.0.1:{a2a_port}",
                          "expose": ["echo", "phantom"], "clients": 1}
    assert doc["schedules"]["count"] == 2
    upcoming = doc["schedules"]["next"]
    assert (upcoming["name"], upcoming["agent"]) == ("hourly", "echo@local")
    assert started + 3_000_000 < upcoming["at_ms"] <= started + 3_700_000
    assert doc["fleet"] == {"configured": True, "host": "web-1", "servers": 1, "process": None}
    assert doc["file_modes"] == []
    unknown = doc["unknown_names"]
    assert len(unknown) == 3, unknown
    assert any("[[schedules]] 'orphan': agent = 'missing@local' names no loaded agent" in u for u in unknown)
    assert any("[[webhooks.routes]] /hooks/ghost: agent = 'ghost'" in u for u in unknown)
    assert any("[a2a] expose: 'phantom' names no loaded agent" in u for u in unknown)
    assert all(u.startswith(str(daemon.home / "covenant.toml")) for u in unknown)
    assert daemon.log().count(WARNING) == 3  # said once each at start

    text = daemon.cli("status", check=True).stdout
    assert f"webhooks   listening on 127.0.0.1:{hook_port}, 2 routes" in text
    assert f"a2a        listening on 127.0.0.1:{a2a_port} (http://127.0.0.1:{a2a_port}), exposes echo, phantom; " \
           "1 client" in text
    assert "schedules  2; next hourly (echo@local) at " in text
    assert "fleet      host web-1, 1 NATS server; no covenant fleet process has asked this daemon" in text
    assert text.count("\nwarning    ") == 3, text

    # covenant fleet asks (its header, from root or the daemon's uid): status says so.
    assert _status_as_fleet(daemon) == 200
    fleet = json.loads(daemon.cli("status", "--json", check=True).stdout)["fleet"]["process"]
    assert fleet["pid"] == os.getpid() and fleet["connected"] is True
    assert f"covenant fleet (pid {os.getpid()}) asked" in daemon.cli("status", check=True).stdout

    # A home file loosened while the daemon runs shows at once, with the fix.
    grants = daemon.home / "grants.toml"
    grants.chmod(0o644)
    text = daemon.cli("status", check=True).stdout
    assert f"files      {grants}: mode 0644 gives others access they must not have" in text
    assert f"fix: chmod 600 {grants}" in text
    grants.chmod(0o600)

    # What the A2A listener refuses is counted: no token or a wrong one (401), a body over the cap (413).
    base = f"http://127.0.0.1:{a2a_port}/a2a/echo"
    assert httpx.post(base, json={}, timeout=60).status_code == 401
    assert httpx.post(base, json={}, headers={"Authorization": "Bearer wrong-token-wrong-token"},
                      timeout=60).status_code == 401
    big = httpx.post(base, content=b"x" * 5000, headers={"Authorization": f"Bearer {TOKEN}",
                                                         "Content-Type": "application/json"}, timeout=60)
    assert big.status_code == 413
    metrics = _metrics(daemon)
    assert 'covenant_http_refused_total{code="401",listener="a2a"} 2.0' in metrics
    assert 'covenant_http_refused_total{code="413",listener="a2a"} 1.0' in metrics

    # A reload that brings the ghost route's agent drops its warning and says the others again.
    daemon.add_agent("ghost", "echo.py", keywords=("ghost",))
    assert daemon.cli("reload").returncode == 0
    unknown = json.loads(daemon.cli("status", "--json", check=True).stdout)["unknown_names"]
    assert len(unknown) == 2 and not any("/hooks/ghost" in u for u in unknown), unknown
    assert daemon.log().count(WARNING) == 5
    assert daemon.stop() == 0
