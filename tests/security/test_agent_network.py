"""Agents and their tools live off the host's network (issue 35 item 1).

A root daemon runs each agent uid's processes in network namespaces of its own: ``off`` has only its
loopback; ``full`` reaches the world through slirp4netns; ``outbound-https-only`` reaches TCP 443 only.
None of them reaches the host: not its loopback (a listener there stands for a database or a local
model server), not its own addresses, not the host end of the link to "the internet" — except what
``[isolation] host_allow`` lists. "The internet" here is a network namespace of the test's own behind
a veth pair, with listeners on ports 443 and 8080.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_process_tool, add_rune_agent, configure, outcome_of
from tests.veth import Internet, far_namespace

PROBE = Path(__file__).parent / "agents" / "netprobe.py"

_LISTEN = """
import socket, sys, threading
def serve(port):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((sys.argv[1], port))
    server.listen(64)
    while True:
        conn, _ = server.accept()
        conn.close()
for port in (443, 8080):
    threading.Thread(target=serve, args=(port,), daemon=True).start()
print("listening", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def internet() -> Iterator[Internet]:
    """Listeners on 443 and 8080 of "the internet"."""
    with far_namespace("v", 213, _LISTEN) as world:
        yield world


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A port the host listens on, on every address: what agents must never reach."""
    with socket.create_server(("0.0.0.0", 0)) as server:
        server.listen(64)
        yield server.getsockname()[1]


def _host_address() -> str | None:
    """An address of the host other than loopback (the one its default route would use), if any."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.123", 9))  # no packet is sent: this only picks the source address
        return probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()


def _add_probe_agent(d: DaemonProcess, name: str, network: str) -> None:
    folder = d.home / "agents" / name
    folder.mkdir(parents=True)
    shutil.copy(PROBE, folder / "netprobe.py")
    (folder / "netprobe.py").chmod(0o644)
    (folder / "agent.toml").write_text(textwrap.dedent(f"""\
        [agent]
        id = "{name}@local"
        name = "{name}"
        version = "0.1.0"
        runtime = "python3"
        entry = "netprobe.py"

        [resources]
        network = "{network}"
        """))


def _reached(d: DaemonProcess, agent: str, *targets: str) -> dict:
    done = d.cli("dispatch", " ".join(targets), "--agent", agent, "--json", timeout=120)
    outcome = json.loads(done.stdout)
    assert outcome["outcome"] == "ok", outcome
    return json.loads(outcome["text"])


def test_agents_reach_the_world_by_their_network_and_never_the_host(
    daemon: DaemonProcess, internet: Internet, host_listener: int
) -> None:
    for name, network in (("full", "full"), ("https", "outbound-https-only"), ("off", "off")):
        _add_probe_agent(daemon, name, network)
    daemon.write_config('[runtime]\npython3 = "/usr/bin/python3"\n')
    daemon.start()
    host = [f"127.0.0.1:{host_listener}", f"10.0.2.2:{host_listener}", f"{internet.near}:{host_listener}"]
    if (address := _host_address()) is not None:
        host.append(f"{address}:{host_listener}")
    world = [f"{internet.far}:443", f"{internet.far}:8080"]

    full = _reached(daemon, "full@local", *world, *host)
    assert [full["reached"][t] for t in world] == ["ok", "ok"], full
    assert all(full["reached"][t] != "ok" for t in host), full
    assert full["interfaces"] == ["lo", "tap0"]

    https = _reached(daemon, "https@local", *world, *host)
    assert https["reached"][world[0]] == "ok" and https["reached"][world[1]] != "ok", https
    assert all(https["reached"][t] != "ok" for t in host), https

    off = _reached(daemon, "off@local", *world, *host)
    assert off["interfaces"] == ["lo"] and all(result != "ok" for result in off["reached"].values()), off

    # One namespace per agent and mode, kept between runs; none of them is the host's.
    again = _reached(daemon, "full@local")
    host_netns = os.readlink("/proc/self/ns/net")
    assert again["netns"] == full["netns"] and len({full["netns"], https["netns"], off["netns"], host_netns}) == 4
    status = daemon.api("GET", "/v1/status")
    assert status["isolation_detail"]["network"]["egress"] is True, status["isolation_detail"]  # type: ignore[index]


def test_host_allow_opens_one_host_service_and_nothing_else(
    daemon: DaemonProcess, internet: Internet, host_listener: int
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as other:
        _add_probe_agent(daemon, "full", "full")
        daemon.write_config(f'[runtime]\npython3 = "/usr/bin/python3"\n\n[isolation]\n'
                            f'host_allow = ["127.0.0.1:{host_listener}"]\n')
        daemon.start()
        allowed, closed = f"10.0.2.2:{host_listener}", f"10.0.2.2:{other.getsockname()[1]}"
        seen = _reached(daemon, "full@local", allowed, closed, f"{internet.far}:443")
    assert seen["reached"] == {allowed: "ok", closed: seen["reached"][closed], f"{internet.far}:443": "ok"}
    assert seen["reached"][closed] != "ok", seen


def test_tools_get_network_only_when_they_declare_it(
    daemon: DaemonProcess, fake_model: FakeModelServer, internet: Internet, host_listener: int
) -> None:
    """A process tool without the network capability has its own loopback only; one that declares it
    gets ``[tools] tool_network`` (outbound-https-only by default); neither reaches the host. The
    replica itself runs in a namespace with a loopback only."""
    configure(daemon, ("fake", fake_model), extra='[runtime]\npython3 = "/usr/bin/python3"\n')
    package = add_rune_agent(daemon, toolset=("plain", "networked"))
    source = PROBE.read_text()
    add_process_tool(package, "plain", source)
    add_process_tool(package, "networked", source)
    descriptor = package / "tools" / "networked.yaml"
    descriptor.write_text(descriptor.read_text() + "capabilities: [network]\ntimeout_ms: 30000\n")
    plain = package / "tools" / "plain.yaml"
    plain.write_text(plain.read_text() + "timeout_ms: 30000\n")
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    targets = [f"{internet.far}:443", f"{internet.far}:8080", f"127.0.0.1:{host_listener}", f"{internet.near}:{host_listener}"]
    fake_model.script(
        Reply.tools(ToolCall("plain", {"targets": targets}), ToolCall("networked", {"targets": targets})),
        Reply(text="done"),
    )
    assert outcome_of(daemon.cli("dispatch", "probe", "--agent", "chat@local", "--json"))["outcome"] == "ok"
    results = {m["tool_call_id"]: json.loads(m["content"]) for m in fake_model.requests[1].body["messages"]
               if m.get("role") == "tool"}
    plain, networked = (json.loads(r["content"]) if isinstance(r, dict) and "content" in r else r
                        for r in results.values())
    assert plain["interfaces"] == ["lo"] and set(plain["reached"].values()) != {"ok"}
    assert all(value != "ok" for value in plain["reached"].values()), plain
    assert "reached" in networked, networked
    assert networked["reached"][targets[0]] == "ok" and networked["reached"][targets[1]] != "ok", networked
    assert all(networked["reached"][t] != "ok" for t in targets[2:]), networked
    (replica,) = daemon.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
    lines = Path(f"/proc/{replica['pid']}/net/dev").read_text().splitlines()[2:]
    assert [line.split(":")[0].strip() for line in lines] == ["lo"]
