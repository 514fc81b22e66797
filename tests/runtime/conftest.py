"""Helpers for the runner tests: agents built directly, payloads, leftover checks."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from covenant.config import RuntimeConfig
from covenant.manifest.model import AgentSpec, Resources, Settlement
from covenant.runtime.runner import Runner

AGENTS = Path(__file__).resolve().parent / "agents"


def make_agent(entry: str | Path, runtime: str = "python3", priority: str = "normal", **resources: Any) -> AgentSpec:
    path = Path(entry) if Path(entry).is_absolute() else AGENTS / entry
    return AgentSpec(
        id="fault@test",
        name="fault",
        version="0.1.0",
        runtime=runtime,
        kind="agent.toml",
        manifest_path=path.parent / "agent.toml",
        root=path.parent,
        entry=path,
        # No network unless a test asks: agents with egress need a namespace of their own (uid isolation),
        # and most runners here run agents as the test's own uid.
        resources=Resources(**{"network": "off", **resources}),
        settlement=Settlement(priority=priority),
    )


def make_payload(text: str) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "text": text,
        "issuer": {"display": "tester@host", "pubkey": ""},
        "issued_at": 1714938000000,
        "priority": "normal",
        "parent": None,
    }


def leftovers(intent_id: str) -> list[int]:
    """Live processes (any parent) that carry the dispatch's marker in their environment."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("COVENANT_INTENT_ID") == intent_id:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def runtime_config() -> RuntimeConfig:
    return RuntimeConfig(kill_grace_ms=500)


@pytest.fixture
async def runner(tmp_path: Path, runtime_config: RuntimeConfig) -> AsyncIterator[Runner]:
    async with Runner.open(runtime_config, scratch_root=tmp_path / "scratch") as r:
        yield r
