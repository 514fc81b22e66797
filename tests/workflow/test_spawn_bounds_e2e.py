"""Spawned agents in a real root daemon (issue 35 item 3), one daemon for the module:

- each bound past the spawner's (memory, timeouts, token budget, providers, safety, toolset, networks, a
  health probe under its floor) is refused with its field named;
- a spawned id is its issuer's: ``NAME@spawned-<12 hex of the issuer's key>``; another issuer neither sees
  nor reaches it and gets a helper of the same name of its own;
- it never shadows a loaded agent of its name, nor the A2A ``expose`` entry that names one;
- its uid comes from the spawned sub-range and is given back, with its workspace, once it has ended.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.daemon.conftest import DaemonProcess, daemon_home
from tests.daemon.test_daemon_e2e import wait_for
from tests.daemon.test_visibility import OWNER_A, _get, _open_socket_to_everyone, _require_system_python
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import configure, outcome_of
from tests.workflow.conftest import rune_agent
from tests.workflow.test_agent_spawn import helper_id

pytestmark = pytest.mark.xdist_group("spawn_bounds")

TOKEN_ENV = "A2A_TOKEN_SPAWN"
BOSS = """name: boss
version: 0.1.0
instructions: You make helpers.
default_model: default
toolset: ["rune@agent-spawn", "rune@agent-kill", "rune@agent-send", "rune@agent-list", "rune@system-time",
          "rune@file-write"]
max_steps: 8
timeout_ms: 60000
networks: ["bridge"]
runtime:
  concurrency_limit: 8
  resource_profile: small
models:
  providers: ["fake"]
  model_mapping:
    default: fake-model
  token_budget: 50000
  safety_policy: strict
"""
HELPER = """name: helper
version: 0.1.0
instructions: You help your spawner.
default_model: default
toolset: ["rune@file-write", "rune@system-time"]
models:
  model_mapping:
    default: fake-model
"""


@dataclass
class Spawning:
    daemon: DaemonProcess
    fake: FakeModelServer
    a2a_port: int
    other_env: dict[str, str]
    """The environment of the second issuer's CLI (its own identity)."""

    def boss(self, text: str, *, other: bool = False) -> dict:
        return outcome_of(self.daemon.cli("dispatch", text, "--agent", "boss@local", "--json",
                                          env=self.other_env if other else None))

    def tool_results(self) -> list[dict]:
        """The tool results the boss's model got in its last turn (the boss is ``strict``: each comes wrapped as
        untrusted data, its JSON on the lines between)."""
        return [json.loads(m["content"].split("\n", 1)[1].rsplit("\n", 1)[0])
                for m in self.fake.requests[-1].messages if m.get("role") == "tool"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def spawning(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawning]:
    user_dir = tmp_path_factory.mktemp("spawning")
    with daemon_home(user_dir) as d, FakeModelServer() as fake:
        port = _free_port()
        d.env[TOKEN_ENV] = "tok-" + secrets.token_hex(16)
        configure(d, ("fake", fake), extra=f"""
            [rune]
            spawned_max = 8

            [a2a]
            listen = "127.0.0.1:{port}"
            expose = ["helper"]

            [[a2a.clients]]
            name = "ci"
            token_env = "{TOKEN_ENV}"
            issuer = "tester@test"
        """)
        (d.home / "agents" / "boss").mkdir(parents=True)
        (d.home / "agents" / "boss" / "Runefile").write_text(BOSS)
        rune_agent(d, "helper")  # a loaded agent of the name the spawned helpers take
        other_env = {"XDG_CONFIG_HOME": str(user_dir / "other-xdg")}
        d.cli("identity", "init", "--display", "other@test", env=other_env, check=True)
        other_key = json.loads(d.cli("identity", "show", "--json", env=other_env, check=True).stdout)["pubkey"]
        d.cli("identity", "add", "other@test", other_key, check=True)
        d.start()
        for issuer in ("tester@test", "other@test"):
            d.cli("grant", issuer, "agent.spawn", "tool.*", check=True)
        yield Spawning(d, fake, port, other_env)
        assert d.stop() == 0, d.log()
        low, high = d.uid_range
        left = [p.pid for p in psutil.process_iter(["uids"]) if low <= p.info["uids"].real <= high]
        assert left == [], f"processes of the home's agent uids outlived the daemon: {left}"


def _uids(d: DaemonProcess) -> dict[str, int]:
    return json.loads((d.home / "state" / "isolation" / "uids.json").read_text())["agents"]


def test_each_bound_past_the_spawners_is_refused_with_its_field_named(spawning: Spawning) -> None:
    beyond = {
        "runtime.resource_profile": HELPER + "runtime:\n  resource_profile: large\n",
        "timeout_ms": HELPER + "timeout_ms: 120000\n",
        "models.token_budget": HELPER.replace("models:\n", "models:\n  token_budget: 1000000000\n"),
        "models.providers": HELPER.replace("models:\n", "models:\n  providers: [\"fake\", \"elsewhere\"]\n"),
        "models.safety_policy": HELPER.replace("models:\n", "models:\n  safety_policy: standard\n"),
        "toolset": HELPER.replace('"rune@system-time"]', '"rune@shell-exec"]'),
        "networks": HELPER + "networks: [\"bridge\", \"internet\"]\n",
        "runtime.health_probe.interval_ms": HELPER + "runtime:\n  health_probe:\n    interval_ms: 1\n",
    }
    spawning.fake.script(Reply.tools(*(ToolCall("agent-spawn", {"manifest": m}) for m in beyond.values())),
                         Reply(text="none of them"))
    assert spawning.boss("make helpers")["outcome"] == "ok"
    results = spawning.tool_results()
    assert len(results) == len(beyond)
    for field, result in zip(beyond, results):
        error = result["error"]
        assert error["code"] == "spawn_refused" and f"{field}:" in error["message"], (field, error)
    assert spawning.daemon.api("GET", "/v1/agents")["spawned"] == []  # type: ignore[index]


def test_a_spawned_id_is_its_issuers_alone_and_never_shadows_a_loaded_agent(spawning: Spawning) -> None:
    d, fake = spawning.daemon, spawning.fake
    mine = helper_id(d)
    other_key = json.loads(d.cli("identity", "show", "--json", env=spawning.other_env, check=True).stdout)["pubkey"]
    theirs = f"helper@spawned-{other_key[:12]}"
    fake.script(Reply.tools(ToolCall("agent-spawn", {"manifest": HELPER})),
                Reply.tools(ToolCall("agent-send", {"agent": "helper", "input": "who are you?"})),
                Reply(text="the loaded helper"), Reply(text="done"))
    assert spawning.boss("make a helper, then ask helper")["text"] == "done"
    assert mine in json.dumps(fake.requests[1 - 4].messages)  # the boss's second turn: agent-spawn's answer
    loaded = [r for r in fake.requests if r.messages[0]["content"].startswith("You are the covenant test agent helper")]
    assert loaded, "a bare 'helper' reached the spawned helper, not the loaded one"
    # The A2A expose entry "helper" still serves the loaded agent, and a person's bare name too.
    card = httpx.get(f"http://127.0.0.1:{spawning.a2a_port}/a2a/helper/.well-known/agent-card.json", timeout=60)
    assert card.status_code == 200 and card.json()["name"] == "helper"
    assert d.cli("dispatch", "hi", "--agent", "helper", "--dry-run", "--json", check=True).returncode == 0

    # The other issuer's boss neither sees nor reaches it, and gets a helper of that name of its own.
    fake.script(Reply.tools(ToolCall("agent-list", {}), ToolCall("agent-send", {"agent": mine, "input": "hi"}),
                            ToolCall("agent-spawn", {"manifest": HELPER})), Reply(text="own helper"))
    assert spawning.boss("find my helpers", other=True)["outcome"] == "ok"
    listed, sent, spawned = spawning.tool_results()
    assert mine not in json.dumps(listed)
    assert sent["error"]["code"] == "agent_refused"
    assert spawned["agent_id"] == theirs != mine
    live = sorted(s["agent"] for s in d.api("GET", "/v1/agents")["spawned"])  # type: ignore[index]
    assert live == sorted([mine, theirs])
    # A local user who does not see every dispatch record sees no spawned agent at all.
    _require_system_python()
    _open_socket_to_everyone(d)
    status, listed = _get(d, OWNER_A, OWNER_A, "/v1/agents")
    assert status == 200 and listed["spawned"] == [] and not [a for a in listed["agents"] if "@spawned" in a["id"]]
    assert _get(d, OWNER_A, OWNER_A, f"/v1/agents/{mine}")[0] == 404
    status, seen = _get(d, OWNER_A, OWNER_A, "/v1/status")
    assert status == 200 and "@spawned" not in json.dumps(seen)
    assert mine in json.dumps(d.api("GET", "/v1/status"))  # root does
    fake.script(Reply.tools(ToolCall("agent-kill", {"agent_id": "helper"})), Reply(text="gone"))
    assert spawning.boss("kill my helper", other=True)["outcome"] == "ok"
    assert [s["agent"] for s in d.api("GET", "/v1/agents")["spawned"]] == [mine]  # type: ignore[index]


def test_a_spawned_agents_uid_is_from_its_sub_range_and_given_back_with_its_files(spawning: Spawning) -> None:
    d, fake = spawning.daemon, spawning.fake
    mine = helper_id(d)
    if mine not in [s["agent"] for s in d.api("GET", "/v1/agents")["spawned"]]:  # type: ignore[index]
        fake.script(Reply.tools(ToolCall("agent-spawn", {"manifest": HELPER})), Reply(text="made"))
        assert spawning.boss("make a helper")["outcome"] == "ok"
    low, high = d.uid_range
    spawned_part = (high - min(256, (high - low + 1) // 8) + 1, high)
    uid = _uids(d)[mine]
    assert spawned_part[0] <= uid <= spawned_part[1]
    assert all(not spawned_part[0] <= u <= spawned_part[1] for agent, u in _uids(d).items() if "@spawned" not in agent)

    fake.script(Reply.tools(ToolCall("agent-send", {"agent": mine, "input": "leave a note"})),
                Reply.tools(ToolCall("file-write", {"path": "note.txt", "content": "mine"})),
                Reply(text="written"), Reply(text="it wrote"))
    assert spawning.boss("have the helper write")["text"] == "it wrote"
    workspace = d.home / "state" / "workspaces" / mine
    assert (workspace / "note.txt").stat().st_uid == uid

    fake.script(Reply.tools(ToolCall("agent-kill", {"agent_id": mine})), Reply(text="gone"))
    assert spawning.boss("kill the helper")["outcome"] == "ok"
    wait_for(lambda: f'files given back" agent={mine}' in d.log(), timeout=60, what="the spawned agent's uid given back")
    assert mine not in _uids(d) and not workspace.exists()
    assert not [p for p in psutil.process_iter(["uids"]) if p.info["uids"].real == uid]
    with open(f"/run/covenant-uids/{uid}.lock", "rb") as lock:  # no longer held by the home
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert os.path.isdir(d.home / "state" / "workspaces")  # the others' stay
    assert Path(d.home / "state" / "spawned").is_dir()
