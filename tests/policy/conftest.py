"""Fixtures for the policy tests: keys, a grant store in a temp home, agents."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.home import Home
from covenant.keys import create_key_file, public_key_hex
from covenant.manifest.model import AgentSpec, Capabilities, Settlement
from covenant.policy.grants import GrantStore

NOW = 1_760_000_000_000  # a fixed "now" in ms; tests pass time explicitly, never sleep


@pytest.fixture
def daemon_key(home: Home) -> Ed25519PrivateKey:
    return create_key_file(home.daemon_key_path)


@pytest.fixture
def store(home: Home, daemon_key: Ed25519PrivateKey) -> GrantStore:
    return GrantStore(home.grants_path, daemon_key.public_key())


@pytest.fixture
def alice() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def alice_pub(alice: Ed25519PrivateKey) -> str:
    return public_key_hex(alice)


def make_agent(
    required: tuple[str, ...] = (),
    optional: tuple[str, ...] = (),
    budget: int = 0,
    agent_id: str = "research@local",
) -> AgentSpec:
    root = Path("/srv/agents/research")
    return AgentSpec(
        id=agent_id,
        name="research",
        version="0.1.0",
        runtime="python3",
        kind="agent.toml",
        manifest_path=root / "agent.toml",
        root=root,
        entry=root / "main.py",
        capabilities=Capabilities(required=required, optional=optional),
        settlement=Settlement(budget_credits_per_hour=budget),
    )


@pytest.fixture
def agent_factory() -> Callable[..., AgentSpec]:
    return make_agent
