"""`covenant reload` re-reads covenant.toml in a real daemon: what can change live is applied without a restart,
what cannot is named as needing one (and keeps serving as started), and a broken file changes nothing."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from covenant.audit.recent import records_since
from covenant.triggers.webhooks import signature_header
from tests.conftest import REPO_ROOT
from tests.daemon.conftest import DaemonProcess, agent_processes
from tests.daemon.test_daemon_e2e import wait_for
from tests.fakes import FakeModelServer, Reply
from tests.rune.conftest import KEY_ENV, KEY_VALUE, add_rune_agent, outcome_of

HOOK_SECRET = "whsec-reload-" + "5e" * 12
TOKEN_CI = "tok-ci-" + "a1" * 16
TOKEN_LATE = "tok-late-" + "b2" * 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reload(d: DaemonProcess) -> tuple[int, dict[str, Any], str]:
    result = d.cli("reload", "--json")
    return result.returncode, json.loads(result.stdout), result.stderr


def _config_events(d: DaemonProcess) -> list[dict[str, Any]]:
    return [r["data"] for r in records_since(d.home / "audit", 0, frozenset({"config.reloaded"}))[::-1]]


def test_a_provider_added_by_reload_serves_a_rune_agent_and_one_without_its_key_is_named(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    daemon.env[KEY_ENV] = KEY_VALUE  # the daemon's environment is fixed at its start; the table comes later
    add_rune_agent(daemon, "chat", toolset=())
    add_rune_agent(daemon, "keyless", toolset=(), providers=("elsewhere",))
    daemon.start()
    before = outcome_of(daemon.cli("dispatch", "hello", "--agent", "chat", "--json"))
    assert before["outcome"] == "provider_unavailable" and "no [providers.fake] table" in before["error"], before

    daemon.write_config(
        fake_model.provider_toml("fake", api_key_env=KEY_ENV, timeout_s=10)
        + '\n[providers.elsewhere]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\napi_key_env = "NOT_IN_ENV"\n'
    )
    code, doc, stderr = _reload(daemon)
    assert code == 0, stderr
    assert doc["config"] == {"changed": ["providers.elsewhere", "providers.fake"], "needs_restart": [], "error": None}

    fake_model.script(Reply(text="hello from a reloaded provider"))
    after = outcome_of(daemon.cli("dispatch", "hello", "--agent", "chat", "--json"))
    assert after["outcome"] == "ok" and after["text"] == "hello from a reloaded provider", after
    assert fake_model.requests[-1].headers["authorization"] == f"Bearer {KEY_VALUE}"
    # A provider whose key variable the daemon's environment lacks is reported as at start: skipped, named.
    keyless = outcome_of(daemon.cli("dispatch", "hello", "--agent", "keyless", "--json"))
    assert keyless["outcome"] == "provider_unavailable" and "NOT_IN_ENV" in keyless["error"], keyless
    assert "provider key variable not set" in daemon.log() and "NOT_IN_ENV" in daemon.log()
    assert KEY_VALUE not in json.dumps(_config_events(daemon)) and KEY_VALUE not in daemon.log()
    assert daemon.stop() == 0
    assert agent_processes(daemon.home) == []


def test_a_tools_change_gives_a_running_replica_its_new_toolset(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    daemon.env[KEY_ENV] = KEY_VALUE
    daemon.write_config(fake_model.provider_toml("fake", api_key_env=KEY_ENV, timeout_s=10))
    add_rune_agent(daemon, "chat", toolset=("rune@web-search",))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.web_search", check=True)
    fake_model.script(Reply(text="one"), Reply(text="two"))
    assert outcome_of(daemon.cli("dispatch", "a", "--agent", "chat", "--json"))["outcome"] == "ok"
    assert "web-search" not in fake_model.requests[-1].tool_names  # no [tools.web_search] url: not offered
    [replica] = daemon.api("GET", "/v1/status")["replicas"]  # type: ignore[index]

    daemon.write_config(fake_model.provider_toml("fake", api_key_env=KEY_ENV, timeout_s=10)
                        + '\n[tools.web_search]\nurl = "http://127.0.0.1:9/search"\n')
    code, doc, stderr = _reload(daemon)
    assert code == 0 and doc["config"]["changed"] == ["tools.web_search.url"], (doc, stderr)

    def replaced() -> bool:
        [now] = daemon.api("GET", "/v1/status")["replicas"]  # type: ignore[index]
        return now["pid"] not in (None, replica["pid"]) and now["state"] == "ready"

    wait_for(replaced, what="the replica started again with its new toolset")
    assert outcome_of(daemon.cli("dispatch", "b", "--agent", "chat", "--json"))["outcome"] == "ok"
    assert "web-search" in fake_model.requests[-1].tool_names
    assert daemon.stop() == 0


def test_a_changed_mcp_server_table_restarts_that_server_with_its_agents_replica(
    daemon: DaemonProcess, fake_model: FakeModelServer, agent_reachable_dir: Path
) -> None:
    script = agent_reachable_dir / "server.py"
    shutil.copy(REPO_ROOT / "tests" / "fakes" / "mcp_stdio_server.py", script)
    script.chmod(0o644)
    daemon.env[KEY_ENV] = KEY_VALUE
    provider = fake_model.provider_toml("fake", api_key_env=KEY_ENV, timeout_s=10)
    daemon.write_config(f'{provider}\n[mcp.hostile]\ncommand = ["{sys.executable}", "{script}"]\n')
    add_rune_agent(daemon, "chat", toolset=("hostile/look",))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(Reply(text="one"), Reply(text="two"))
    assert outcome_of(daemon.cli("dispatch", "a", "--agent", "chat", "--json"))["outcome"] == "ok"
    assert fake_model.requests[-1].tool_names == ["hostile__look"]

    def servers() -> list[dict[str, Any]]:
        return daemon.api("GET", "/v1/status")["mcp_servers"]  # type: ignore[index,no-any-return]

    [before] = servers()
    assert before["state"] == "up" and f"--data={agent_reachable_dir}" not in before["endpoint"]
    # Changed: the server starts again as the new table says. Unchanged tables and other agents are left alone.
    daemon.write_config(f'{provider}\n[mcp.hostile]\ncommand = ["{sys.executable}", "{script}", '
                        f'"--data={agent_reachable_dir}"]\n')
    code, doc, stderr = _reload(daemon)
    assert code == 0 and doc["config"] == {"changed": ["mcp.hostile"], "needs_restart": [], "error": None}, stderr
    # The replica restarts (lazily started agents get their servers at their next dispatch).
    def old_one_gone() -> bool:
        listed = servers()  # read once: the old server may leave the list between two reads
        return not listed or f"--data={agent_reachable_dir}" in listed[0]["endpoint"]

    wait_for(old_one_gone, what="the old server to stop")
    assert outcome_of(daemon.cli("dispatch", "b", "--agent", "chat", "--json"))["outcome"] == "ok"
    [after] = servers()
    assert after["state"] == "up" and after["endpoint"].endswith(f"--data={agent_reachable_dir}"), after
    assert fake_model.requests[-1].tool_names == ["hostile__look"]
    assert daemon.stop() == 0
    assert agent_processes(daemon.home) == []


def _post(port: int, path: str, body: bytes, t_offset: int = 0) -> httpx.Response:
    header = signature_header(HOOK_SECRET.encode(), int(time.time()) + t_offset, body)
    return httpx.post(f"http://127.0.0.1:{port}{path}", content=body, timeout=60,
                      headers={"content-type": "text/plain", "Covenant-Signature": header})


def _send(port: int, token: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"messageId": token[-8:], "role": "ROLE_USER", "parts": [{"text": "over a2a"}]}}}
    return httpx.post(f"http://127.0.0.1:{port}/a2a/echo", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {token}"})


def _front_doors(hooks: int, a2a: int, *, route: str, clients: str = "", schedules: str = "",
                 listen: int | None = None) -> str:
    return f"""
        [webhooks]
        listen = "127.0.0.1:{listen or hooks}"

        [[webhooks.routes]]
        path = "{route}"
        agent = "echo@local"
        issuer = "tester@test"
        secret_env = "HOOK_SECRET"
        rate = "600/minute"

        [a2a]
        listen = "127.0.0.1:{a2a}"
        expose = ["echo"]

        [[a2a.clients]]
        name = "ci"
        token_env = "TOKEN_CI"
        issuer = "tester@test"
        {clients}
        {schedules}
    """


LATE_CLIENT = """
        [[a2a.clients]]
        name = "late"
        token_env = "TOKEN_LATE"
        issuer = "tester@test"
"""
TICK = """
        [[schedules]]
        name = "tick"
        agent = "echo@local"
        input = "tick"
        every = "1s"
        issuer = "tester@test"
"""


def test_routes_clients_and_schedules_reload_live_a_listen_change_waits_and_a_broken_file_changes_nothing(
    daemon: DaemonProcess,
) -> None:
    hooks, a2a, moved = _free_port(), _free_port(), _free_port()
    daemon.env.update(HOOK_SECRET=HOOK_SECRET, TOKEN_CI=TOKEN_CI, TOKEN_LATE=TOKEN_LATE)
    daemon.add_agent("echo", "echo.py")
    daemon.write_config(_front_doors(hooks, a2a, route="/hooks/old"))
    daemon.start()
    assert _post(hooks, "/hooks/old", b"before").status_code == 200
    assert _send(a2a, TOKEN_LATE).status_code == 401

    daemon.write_config(_front_doors(hooks, a2a, route="/hooks/new", clients=LATE_CLIENT, schedules=TICK, listen=moved))
    code, doc, stderr = _reload(daemon)
    assert code == 0, stderr
    assert doc["config"] == {
        "changed": ["webhooks.routes[/hooks/old]", "webhooks.routes[/hooks/new]", "a2a.clients[late]", "schedules[tick]"],
        "needs_restart": ["webhooks.listen"], "error": None}
    text = daemon.cli("reload").stdout
    assert "config needs a restart to apply: webhooks.listen" in text

    # The route moved on the listener that still serves where it was started; the new address is not bound.
    assert _post(hooks, "/hooks/new", b"after").json()["outcome"] == "ok"
    assert _post(hooks, "/hooks/old", b"after", t_offset=1).status_code == 404
    try:
        httpx.get(f"http://127.0.0.1:{moved}/", timeout=5)
        raise AssertionError(f"something answers on {moved}, which needs a restart to be bound")
    except httpx.ConnectError:
        pass
    # The new A2A client's token is accepted; the old one still is.
    late = _send(a2a, TOKEN_LATE)
    assert late.status_code == 200 and late.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", late.text
    assert _send(a2a, TOKEN_CI).status_code == 200
    # The new schedule is listed and fires.
    listed = json.loads(daemon.cli("schedules", "--json", check=True).stdout)["schedules"]
    assert [s["name"] for s in listed] == ["tick"]
    wait_for(lambda: any(r["data"]["schedule"] == "tick" for r in
                         records_since(daemon.home / "audit", 0, frozenset({"schedule.fire"}))), what="tick to fire")
    status = daemon.api("GET", "/v1/status")
    assert status["config"] == {"needs_restart": ["webhooks.listen"]}  # type: ignore[index]
    assert "applied at the next restart: webhooks.listen" in daemon.cli("status", check=True).stdout

    # A file that does not validate: exit 1 naming the file, the line and the key; nothing of it applies.
    config_path = daemon.home / "covenant.toml"
    good = config_path.read_text()
    config_path.write_text(good.replace("[webhooks]\n", "[webhooks]\nmax_body_kb = \"big\"\n"))
    bad_line = config_path.read_text().splitlines().index('max_body_kb = "big"') + 1
    broken = daemon.cli("reload")
    assert broken.returncode == 1
    assert f"{config_path}:{bad_line}: [webhooks] max_body_kb: must be an integer" in broken.stderr, broken.stderr
    assert "covenant.toml not applied" in broken.stderr
    # Resolvable only in part: a route whose secret variable is unset is named with its line, and the
    # rest of that file (the late client gone) is not applied either.
    config_path.write_text(_front_doors(hooks, a2a, route="/hooks/new", schedules=TICK).replace(
        'secret_env = "HOOK_SECRET"', 'secret_env = "NO_SUCH_SECRET"'))
    unset_line = config_path.read_text().splitlines().index('        secret_env = "NO_SUCH_SECRET"') + 1
    code, doc, _ = _reload(daemon)
    assert code == 1 and doc["config"]["changed"] == [] and doc["config"]["needs_restart"] == []
    assert doc["config"]["error"].startswith(f"{config_path}:{unset_line}: [[webhooks.routes]] /hooks/new"), doc
    assert "NO_SUCH_SECRET" in doc["config"]["error"]
    assert _send(a2a, TOKEN_LATE).status_code == 200  # the running config is whole
    assert _post(hooks, "/hooks/new", b"still served", t_offset=2).json()["outcome"] == "ok"

    events = _config_events(daemon)
    assert [(e["reason"], e["needs_restart"], e["error"] is None) for e in events] == [
        ("api", ["webhooks.listen"], True), ("api", ["webhooks.listen"], True), ("api", [], False), ("api", [], False)]
    assert events[0]["changed"] == [
        "webhooks.routes[/hooks/old]", "webhooks.routes[/hooks/new]", "a2a.clients[late]", "schedules[tick]"]
    assert events[1]["changed"] == [] and "NO_SUCH_SECRET" in events[3]["error"]
    audit_bytes = b"".join(p.read_bytes() for p in (daemon.home / "audit").rglob("*") if p.is_file())
    for secret in (HOOK_SECRET, TOKEN_CI, TOKEN_LATE):
        assert secret.encode() not in audit_bytes and secret not in daemon.log()
    assert daemon.stop() == 0
    assert agent_processes(daemon.home) == []


def test_reload_with_an_unreadable_covenant_toml_keeps_serving(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py")
    daemon.start()
    (daemon.home / "covenant.toml").write_text("[daemon\nmax_concurrent = 2\n")
    broken = daemon.cli("reload")
    assert broken.returncode == 1 and "not valid TOML" in broken.stderr and "line 1" in broken.stderr, broken.stderr
    assert "reloaded: 1 agents" in broken.stdout  # the manifests reload all the same
    assert outcome_of(daemon.cli("dispatch", "still here", "--agent", "echo", "--json"))["outcome"] == "ok"
    assert daemon.stop() == 0
