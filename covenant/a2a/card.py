"""Agent cards of exposed agents: A2A 1.0 at ``<base>/.well-known/agent-card.json``, 0.3 for older clients.

A card describes an agent and where to call it; it grants nothing, so it is
served without a token. Every card names one bearer scheme: calls need a
token from ``[[a2a.clients]]``.
"""

from __future__ import annotations

from typing import Any

from covenant.spawned_ids import is_spawned_id
from covenant.manifest.model import AgentSpec
from covenant.manifest.runefile import RunePackage
from covenant.manifest.workflow import Workflow

__all__ = ["AgentFacts", "card_v1", "card_v03", "describe", "find_agent"]

_DESCRIPTION_MAX = 300
_MODES = ["text/plain", "application/json"]


class AgentFacts:
    """What a card says about an agent: name, description, version, keywords."""

    def __init__(self, agent: AgentSpec, description: str) -> None:
        self.agent = agent
        self.description = description


def describe(agent: AgentSpec, *, instructions: str | None = None, workflow_description: str | None = None) -> AgentFacts:
    """A one-paragraph description: the workflow's own, a Rune agent's instructions' first line, else its kind."""
    text = (workflow_description or "").strip()
    if not text and instructions:
        text = next((line.strip() for line in instructions.splitlines() if line.strip()), "")
    if not text:
        kinds = {"rune": "a hosted Rune agent", "workflow": "a workflow of agents"}
        text = f"{agent.name}: {kinds.get(agent.runtime, f'a {agent.runtime} agent')} supervised by covenant"
    if len(text) > _DESCRIPTION_MAX:
        text = text[: _DESCRIPTION_MAX - 1].rstrip() + "…"
    return AgentFacts(agent, text)


def _skill(facts: AgentFacts) -> dict[str, Any]:
    agent = facts.agent
    return {"id": agent.name, "name": agent.name, "description": facts.description,
            "tags": list(agent.keywords) or [agent.runtime]}


def card_v1(facts: AgentFacts, url: str) -> dict[str, Any]:
    """The A2A 1.0 card of an agent served at ``url`` (JSON-RPC at the URL, HTTP+JSON below it)."""
    return {
        "name": facts.agent.name,
        "description": facts.description,
        "version": facts.agent.version,
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": url, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
        ],
        "capabilities": {"streaming": True, "pushNotifications": False},
        "securitySchemes": {"bearer": {"httpAuthSecurityScheme": {
            "scheme": "Bearer", "description": "a token of [[a2a.clients]] in the daemon's covenant.toml"}}},
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": _MODES,
        "defaultOutputModes": ["text/plain"],
        "skills": [_skill(facts)],
    }


def card_v03(facts: AgentFacts, url: str) -> dict[str, Any]:
    """The same card in A2A 0.3's shape, for clients of the older protocol (raftio's among them)."""
    return {
        "name": facts.agent.name,
        "description": facts.description,
        "url": url,
        "version": facts.agent.version,
        "protocolVersion": "0.3.0",
        "preferredTransport": "JSONRPC",
        "capabilities": {"streaming": True, "pushNotifications": False},
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "security": [{"bearer": []}],
        "defaultInputModes": _MODES,
        "defaultOutputModes": ["text/plain"],
        "skills": [_skill(facts)],
    }


def find_agent(name: str, agents: dict[str, AgentSpec], packages: dict[str, RunePackage],
               workflows: dict[str, Workflow]) -> AgentFacts | None:
    """The agent an exposed NAME means (an id, or a bare name that one agent has), with its description; never an
    agent made by ``rune@agent-spawn`` (its spawner's and issuer's alone), which therefore never shadows one."""
    agent = agents.get(name)
    if agent is None:
        named = [a for a in agents.values() if a.name == name and not is_spawned_id(a.id)]
        agent = named[0] if len(named) == 1 else None
    if agent is None or is_spawned_id(agent.id):
        return None
    package, workflow = packages.get(agent.id), workflows.get(agent.id)
    return describe(agent, instructions=package.runefile.instructions if package else None,
                    workflow_description=workflow.description if workflow else None)
