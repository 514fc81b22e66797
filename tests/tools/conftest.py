"""Fixtures for the tool host tests: a real runner on a temp home, real grants, packages on disk."""

from __future__ import annotations

import os
import textwrap
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.clock import now_ms
from covenant.config import Config, IsolationConfig
from covenant.home import Home
from covenant.homeinit import init_home
from covenant.keys import create_key_file, load_private_key, public_key_hex
from covenant.manifest.model import AgentSpec
from covenant.manifest.runefile import load_rune_package
from covenant.policy.grants import GrantSet, GrantStore
from covenant.runtime.isolation import Isolation, open_isolation
from covenant.runtime.liveroots import LiveRoots
from covenant.runtime.runner import Runner
from covenant.tools import ToolCallContext, ToolHost
from tests.conftest import agent_uid_range

RUNEFILE = """\
name: {name}
version: 0.1.0
instructions: test agent
default_model: default
toolset:
{toolset}
timeout_ms: 30000
models:
  model_mapping:
    default: test-model
"""


@dataclass
class AuditCollector:
    """The test's audit sink: every (type, data) in order."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def __call__(self, type_: str, data: dict[str, Any]) -> None:
        self.events.append((type_, data))

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [data for t, data in self.events if t == type_]


def write_package(root: Path, name: str, toolset: list[str], files: dict[str, str] | None = None) -> AgentSpec:
    """A Rune package on disk (0755 dirs, 0644 files), loaded as the registry would."""
    root.mkdir(parents=True, exist_ok=True)
    lines = "\n".join(f"  - {entry}" for entry in toolset) or "  []"
    if not toolset:
        lines = ""
    text = RUNEFILE.format(name=name, toolset=lines)
    if not toolset:
        text = text.replace("toolset:\n", "toolset: []\n")
    (root / "Runefile").write_text(text)
    for rel, content in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
        if rel.endswith((".sh", ".bin")) or content.startswith("#!"):
            os.chmod(path, 0o755)
    return load_rune_package(root).to_agent_spec()


@dataclass
class Tools:
    """Everything a test needs to make calls."""

    home: Home
    config: Config
    runner: Runner
    audit: AuditCollector
    host: ToolHost
    daemon_key: Ed25519PrivateKey
    issuer_pub: str
    store: GrantStore
    tmp: Path

    def grant(self, *actions: str) -> GrantSet:
        self.store.add(self.daemon_key, self.issuer_pub, list(actions), None, None)
        return self.store.load()

    def ctx(self, agent: AgentSpec, grants: GrantSet | None = None, *, seconds: float = 60.0,
            intent: str | None = None) -> ToolCallContext:
        """A call context of ``agent``; ``intent`` defaults to an id of its own, so that tests running side by side
        (pytest-xdist) never see each other's tool processes by their ``COVENANT_INTENT_ID`` marker."""
        return ToolCallContext(
            intent_id=intent or f"intent-{uuid.uuid4().hex[:12]}",
            agent=agent,
            issuer_pubkey=self.issuer_pub,
            grants=grants if grants is not None else self.store.load(),
            now_ms=now_ms(),
            deadline=trio.current_time() + seconds,
        )

    def package(self, name: str, toolset: list[str], files: dict[str, str] | None = None) -> AgentSpec:
        return write_package(self.tmp / "agents" / name, name, toolset, files)

    def new_host(self) -> ToolHost:
        return ToolHost(self.home, self.config, self.runner, self.audit)

    def workspace(self, agent: AgentSpec) -> Path:
        """The agent's workspace (made if missing), where a tool with the ``filesystem`` capability runs."""
        return self.host.services.workspace(agent.id).root


@asynccontextmanager
async def _tools(home: Home, packages: Path, config: Config, isolation: Isolation | None = None) -> AsyncIterator[Tools]:
    path = home.daemon_key_path
    daemon_key = load_private_key(path) if path.exists() else create_key_file(path)  # init_home may have made it
    issuer = Ed25519PrivateKey.generate()
    store = GrantStore(home.grants_path, daemon_key.public_key())
    audit = AuditCollector()
    async with Runner.open(config.runtime, scratch_root=home.state_dir / "scratch", isolation=isolation,
                           live_roots=LiveRoots(), rune=config.rune) as runner:
        host = ToolHost(home, config, runner, audit)
        yield Tools(home, config, runner, audit, host, daemon_key, public_key_hex(issuer), store, packages)


@pytest.fixture
async def tools(home: Home, tmp_path: Path) -> AsyncIterator[Tools]:
    """A runner whose agents run as covenant's own uid: built-ins run, process tools are unavailable (their files
    cannot be confined without agent uids)."""
    async with _tools(home, tmp_path, Config()) as made:
        yield made


@asynccontextmanager
async def confined(home: Home, what: str = "process tools", **settings: Any) -> AsyncIterator[Tools]:
    """A runner whose agents (and their tools) run as uids of their own, as under a root daemon, their files
    confined (Landlock), under ``settings`` (covenant.toml sections). Packages go under the home, which agent
    uids reach. Skips, naming ``what`` needs it, without root or Landlock."""
    if os.geteuid() != 0:
        pytest.skip(f"{what} run only where their files are confined: agent uids (root) and Landlock")
    init_home(home)
    isolation = open_isolation(IsolationConfig(uid_range=agent_uid_range()), home.state_dir)
    config = Config.model_validate({"runtime": {"python3": "/usr/bin/python3", "kill_grace_ms": 500}, **settings})
    async with _tools(home, home.root, config, isolation) as made:
        if made.runner.tool_confinement.problem is not None:
            pytest.skip(f"this host cannot confine a tool's files: {made.runner.tool_confinement.problem}")
        yield made


@pytest.fixture
async def confined_tools(home: Home) -> AsyncIterator[Tools]:
    """:func:`confined` for process tools."""
    async with confined(home) as made:
        yield made
