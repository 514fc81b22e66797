"""An agent that listens where a provider should be gets no key (issue 35: a free loopback port of a
fallback provider was bound by an agent, which was then sent the key and believed as the model).

The daemon looks at who owns the other end of each new provider connection before it sends a byte
(covenant.runtime.sockets): a process of an agent uid, of this home or of any other on the host, is
refused as ``provider_impostor`` and the call falls back to the next provider.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from covenant.runtime.uid_locks import UidLocks
from tests.conftest import agent_uid_range
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.daemon.test_daemon_e2e import audit_records
from tests.fakes import FakeModelServer, Reply
from tests.rune.conftest import KEY_ENV, KEY_VALUE, add_rune_agent, outcome_of

# Accepts every connection and keeps what it is sent, as an agent posing as a provider would.
_IMPOSTOR = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen(16)
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    conn.settimeout(5)
    received = b""
    try:
        while chunk := conn.recv(65536):
            received += chunk
    except OSError:
        pass
    with open(sys.argv[2], "ab") as log:
        log.write(b"CONNECTION " + str(len(received)).encode() + b"\\n" + received + b"\\n")
    conn.close()
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _impostor(uid: int, port: int, log: Path) -> subprocess.Popen[str]:
    log.touch()
    os.chown(log, uid, uid)
    process = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-c", _IMPOSTOR,
         str(port), str(log)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "listening"
    return process


@pytest.fixture
def root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("running a listener as an agent uid needs root")


@pytest.mark.parametrize("whose", ["this home's range", "another home's lock"])
def test_a_provider_port_held_by_an_agent_uid_gets_no_key_and_the_call_falls_back(
    root_only: None, whose: str, daemon: DaemonProcess, fake_model: FakeModelServer, agent_reachable_dir: Path
) -> None:
    if whose == "this home's range":
        uid = daemon.uid_range[1]
    else:  # a uid another home on this host holds: outside this daemon's range
        uid = agent_uid_range(1)[0]
        other = UidLocks(str(agent_reachable_dir / "other-home"))
        assert other.take(uid)
    port = _free_port()
    log = agent_reachable_dir / "impostor.log"
    impostor = _impostor(uid, port, log)
    try:
        daemon.write_config(
            f'[providers.local]\nkind = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
            f'api_key_env = "{KEY_ENV}"\ntimeout_s = 3\n\n' + fake_model.provider_toml("fake", timeout_s=10))
        daemon.env[KEY_ENV] = KEY_VALUE
        add_rune_agent(daemon, providers=("local", "fake"), toolset=())
        daemon.start()
        fake_model.script(Reply(text="the real model answered"))
        outcome = outcome_of(daemon.cli("dispatch", "hello", "--agent", "chat@local", "--json"))
        assert outcome["outcome"] == "ok" and outcome["text"] == "the real model answered", outcome
        calls = [r["data"] for r in audit_records(daemon) if r["type"] == "model.call"]
        if whose == "this home's range":
            # The home's host table refuses every packet of its agent gids to the host's own addresses:
            # the impostor cannot even answer the handshake, so the connect itself fails.
            assert [(c["provider"], c["outcome"], c["http_status"], c["error_code"]) for c in calls] == [
                ("local", "error", None, None), ("fake", "ok", 200, None)]
            assert log.read_bytes() == b""
            return
        assert [(c["provider"], c["outcome"], c["http_status"], c["error_code"]) for c in calls] == [
            ("local", "error", None, "provider_impostor"), ("fake", "ok", 200, None)], (
            calls, [line for line in daemon.log().splitlines() if "local" in line][-5:])
        deadline = time.monotonic() + 10
        while "CONNECTION" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the daemon never connected: the check was not made"
            time.sleep(0.05)
        seen = log.read_bytes()
        assert KEY_VALUE.encode() not in seen and b"POST" not in seen
        assert all(line == b"CONNECTION 0" for line in seen.splitlines() if line.startswith(b"CONNECTION"))
        assert "provider impostor refused" in daemon.log()
    finally:
        impostor.kill()
        impostor.wait()


def test_a_provider_on_loopback_run_by_an_ordinary_user_is_used(
    root_only: None, daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """The check refuses agent uids only: a local model server of any other user (here root's, the
    test's own fake) gets its key and answers."""
    daemon.write_config(fake_model.provider_toml("fake", api_key_env=KEY_ENV, timeout_s=10))
    daemon.env[KEY_ENV] = KEY_VALUE
    add_rune_agent(daemon, toolset=())
    daemon.start()
    fake_model.script(Reply(text="hi"))
    assert outcome_of(daemon.cli("dispatch", "hello", "--agent", "chat@local", "--json"))["outcome"] == "ok"
    assert fake_model.requests[0].headers.get("authorization") == f"Bearer {KEY_VALUE}"
    calls = [r["data"] for r in audit_records(daemon) if r["type"] == "model.call"]
    assert [c["error_code"] for c in calls] == [None]
    assert json.dumps(calls).find(KEY_VALUE) == -1
