"""The normalized agent: what the registry yields for both manifest formats.

``agent.toml`` and Runefile packages are parsed by their own modules and
converted to one :class:`AgentSpec`, which is all the runner, the policy
check and the daemon ever see.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AgentSpec",
    "Capabilities",
    "Resources",
    "Settlement",
    "Runtime",
    "Network",
    "Priority",
]

Runtime = Literal["rust-bin", "python3", "node", "rune", "workflow"]
"""``rune`` is a hosted Runefile agent, ``workflow`` a workflow.yaml folder; the others are spawned processes."""

Network = Literal["off", "outbound-https-only", "full"]
Priority = Literal["low", "normal", "high"]

MAX_CPU_MS = 24 * 3600 * 1000
MAX_MEMORY_MB = 1024 * 1024
MAX_DISK_MB = 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Capabilities(_Strict):
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


class Resources(_Strict):
    cpu_ms_per_task: int = Field(30_000, gt=0, le=MAX_CPU_MS)
    memory_mb: int = Field(512, gt=0, le=MAX_MEMORY_MB)
    disk_mb: int = Field(100, gt=0, le=MAX_DISK_MB)
    network: Network = "outbound-https-only"


class Settlement(_Strict):
    budget_credits_per_hour: int = Field(0, ge=0, le=10**12)
    priority: Priority = "normal"


class AgentSpec(BaseModel):
    """One validated, runnable agent."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    version: str
    runtime: Runtime
    kind: Literal["agent.toml", "runefile", "workflow.yaml"]
    manifest_path: Path
    """The file the agent was read from (agent.toml, *.toml or Runefile)."""
    root: Path
    """The manifest's folder: the agent's working directory; entry is resolved against it."""
    entry: Path | None
    """Absolute path of the binary or script; None for hosted rune agents."""
    capabilities: Capabilities = Capabilities()
    resources: Resources = Resources()
    settlement: Settlement = Settlement()
    keywords: tuple[str, ...] = ()
    """Routing keywords ([routing] keywords, or Runefile routing_hints.keywords)."""
    resource_profile: Literal["small", "medium", "large"] | None = None
    """A Runefile's ``runtime.resource_profile``: the class of CPU and memory of its replica and tools
    (:mod:`covenant.runtime.cpu_class`); None for other agents, which ``[resources]`` alone limits."""
    routing_hints: dict[str, Any] = {}
    """A Runefile's ``routing_hints`` as written, every key (the router reads ``keywords``; the rest is shown)."""
    warnings: tuple[str, ...] = ()
    """Non-fatal remarks (unknown top-level sections, a bare id read as name@local)."""
    extra_sections: dict[str, Any] = {}
    """Unknown top-level sections of an agent.toml, kept verbatim for forward compatibility."""
