"""``covenant a2a card NAME``: an exposed agent's A2A card, exactly as the daemon serves it."""

from __future__ import annotations

import click

from covenant.cli._common import CliContext, echo, pass_cli, print_json, reports_errors
from covenant.errors import ConfigError, CovenantError, ExitCode

__all__ = ["a2a"]


class _NotServed(CovenantError):
    code = "not_exposed"
    exit_code = ExitCode.NO_AGENT
    http_status = 404


@click.group()
def a2a() -> None:
    """Inspect what the daemon serves over A2A ([a2a] in covenant.toml; docs/a2a.md)."""


@a2a.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the A2A 1.0 card as JSON, byte for byte what is served.")
@pass_cli
@reports_errors
def card(cli: CliContext, name: str, as_json: bool) -> None:
    """Print the agent card served at <public_url>/a2a/NAME/.well-known/agent-card.json.

    Built from the home's covenant.toml and agents folder, like `agents check`: no daemon needed.
    Exit 6 when NAME is not in [a2a] expose or names no valid agent, 2 when [a2a] listen is unset.
    """
    from covenant.a2a.card import card_v1, find_agent
    from covenant.config import load_config
    from covenant.manifest.limits import ManifestLimits
    from covenant.manifest.registry import scan_agents

    config = load_config(cli.home)
    if config.a2a.listen is None:
        raise ConfigError("[a2a] listen is not set in covenant.toml: the daemon serves no A2A (docs/a2a.md)",
                          field="a2a.listen")
    if name not in config.a2a.expose:
        raise _NotServed(f"{name!r} is not in [a2a] expose (exposed: {', '.join(config.a2a.expose) or 'none'})")
    registry = scan_agents(cli.home.agents_dir, ManifestLimits.from_config(config.runtime))
    workflows = {agent_id: folder.workflow for agent_id, folder in registry.workflows.items()}
    facts = find_agent(name, registry.agents, registry.rune_packages, workflows)
    if facts is None:
        raise _NotServed(f"{name!r} names no valid agent in {cli.home.agents_dir} (see `covenant agents check`)")
    document = card_v1(facts, f"{config.a2a.base_url()}/a2a/{name}")
    if as_json:
        print_json(document)
        return
    echo(f"{document['name']} {document['version']}: {document['description']}")
    for interface in document["supportedInterfaces"]:
        echo(f"  {interface['protocolBinding']:<10} {interface['url']}  (A2A {interface['protocolVersion']})")
    echo(f"  card       {document['supportedInterfaces'][0]['url']}/.well-known/agent-card.json")
    echo("  auth       Bearer token of [[a2a.clients]]")
