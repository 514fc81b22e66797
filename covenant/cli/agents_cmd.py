"""``covenant agents list | show | check``: inspect the registry.

Thin: ``list`` and ``show`` take the data from :func:`covenant.cli._agents.known_agents` (what the
running daemon has loaded, else a local scan of the home's agents folder);
``check`` always scans the files. The rest is printing.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from covenant.agent_names import resolve_agent_id
from covenant.cli._agents import known_agents
from covenant.cli._common import CliContext, echo, pass_cli, print_json, reports_errors, table_lines
from covenant.cli._output import neutralize
from covenant.home import Home
from covenant.manifest.limits import ManifestLimits
from covenant.manifest.model import AgentSpec
from covenant.manifest.problems import ManifestError
from covenant.manifest.registry import Registry, check_paths, scan_agents

if TYPE_CHECKING:
    from covenant.config import Config
    from covenant.manifest.runefile import RunePackage

__all__ = ["agents"]


def _tools(package: RunePackage, config: Config) -> dict[str, Any]:
    """A Rune agent's toolset as the daemon serves it: offered tools and unavailable entries with the reason."""
    from covenant.tools.catalogue import configured_toolset

    toolset = configured_toolset(package, config)
    return {
        "offered": [
            {"entry": t.entry, "name": t.model_name, "action": t.action, "kind": t.kind} for t in toolset.available.values()
        ],
        "unavailable": [{"tool": entry, "reason": reason} for entry, reason in toolset.unavailable],
    }


def _resource_class(spec: AgentSpec, home: Home) -> dict[str, Any] | None:
    """A Rune agent's class of CPU and memory under the home's covenant.toml ``[rune]``; None for other agents."""
    if spec.resource_profile is None:
        return None
    from covenant.config import load_config
    from covenant.runtime.cpu_class import resource_class

    return resource_class(load_config(home).rune, spec.resource_profile)._asdict()


def _rune_tools(spec: AgentSpec, home: Home) -> dict[str, Any] | None:
    """:func:`_tools` of a Rune agent read from its folder; None for other agents."""
    if spec.runtime != "rune":
        return None
    from covenant.manifest.runefile import load_rune_package

    try:
        package = load_rune_package(spec.root)
    except ManifestError as exc:
        return {"offered": [], "unavailable": [], "error": str(exc)}
    from covenant.config import load_config

    return _tools(package, load_config(home))


def _agent_json(spec: AgentSpec, states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The manifest's fields, and the daemon's ``state`` of the agent when a daemon answered."""
    return {**spec.model_dump(mode="json"), **states.get(spec.id, {})}


def _snapshot_lines(specs: list[AgentSpec], states: dict[str, dict[str, Any]]) -> None:
    for spec in specs:
        state = states.get(spec.id, {})
        if state.get("state") == "snapshot":
            echo(f"{spec.id}: runs its last valid version (snapshot) until {state['waiting_on']} loads again")
        if state.get("stopped"):
            echo(f"{spec.id}: stopped (`covenant stop`): its dispatches are refused until `covenant start`")


def _relative(path: Path, folder: Path) -> str:
    """A manifest path relative to the agents folder when it is inside it (narrower table)."""
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)


def _problems_note(registry: Registry) -> None:
    if registry.problems:
        echo(
            f"covenant: {len(registry.problems)} manifest problem(s); run `covenant agents check` for details",
            err=True,
        )


@click.group()
def agents() -> None:
    """List, show and check agent manifests."""


@agents.command("list")
@click.option("--json", "as_json", is_flag=True, help="Stable JSON: {agents: [...], problems: [...], spawned: [...]} (spawned: from a running daemon).")
@pass_cli
@reports_errors
def list_agents(cli: CliContext, as_json: bool) -> None:
    """List the valid agents of the home's agents folder.

    With a running daemon, what it has loaded, and the agents made by rune@agent-spawn: a line
    "NAME@spawned-KEYID: spawned by AGENT for ISSUER, expires TIME" each (--json: "spawned").
    """
    known = known_agents(cli.home)
    registry, spawned = known.registry, known.spawned
    specs = [registry.agents[k] for k in sorted(registry.agents)]
    if as_json:
        print_json({"agents": [_agent_json(s, known.states) for s in specs], "problems": [p.to_json() for p in registry.problems],
                    "spawned": spawned})
        return
    rows = [
        (
            s.id,
            s.runtime,
            s.version,
            ", ".join(s.capabilities.required) or "-",
            ", ".join(s.keywords) or "-",
            str(s.manifest_path),
        )
        for s in specs
    ]
    headers = ("ID", "RUNTIME", "VERSION", "REQUIRES", "KEYWORDS", "MANIFEST")
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(title=Text(f"agents in {cli.home.agents_dir}"))
        for header in headers:
            table.add_column(header, no_wrap=header in ("ID", "RUNTIME", "VERSION"))
        for row in rows:
            # Text, not str: rich reads [markup] in a str, and a manifest's keywords are anyone's words.
            cells = (*row[:-1], _relative(Path(row[-1]), cli.home.agents_dir))
            table.add_row(*(Text(neutralize(cell)) for cell in cells))
        Console().print(table)
    else:
        for line in table_lines(headers, rows):
            echo(line)
    for entry in spawned:
        expires = datetime.fromtimestamp(entry["expires_ms"] / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        echo(f"{entry['agent']}: spawned by {entry['spawner']} for {entry['issuer']}, expires {expires}")
    _snapshot_lines(specs, known.states)
    _problems_note(registry)


@agents.command("show")
@click.argument("agent_id")
@click.option("--json", "as_json", is_flag=True, help="The agent as stable JSON.")
@pass_cli
@reports_errors
def show_agent(cli: CliContext, agent_id: str, as_json: bool) -> None:
    """Show one agent: AGENT_ID is its id or a bare name, as with `dispatch --agent`. Exit 6 when there is no such agent."""
    known = known_agents(cli.home)
    spec = known.registry.agents[resolve_agent_id(agent_id, known.registry.agents)]
    tools = _rune_tools(spec, cli.home)
    resource_class = _resource_class(spec, cli.home)
    if as_json:
        print_json({**_agent_json(spec, known.states), **({"tools": tools} if tools is not None else {}),
                    **({"resource_class": resource_class} if resource_class is not None else {})})
        return
    data = _agent_json(spec, known.states)
    for key in ("id", "name", "version", "runtime", "kind", "manifest_path", "root", "entry"):
        echo(f"{key + ':':<36}{data[key] if data[key] is not None else '-'}")
    for section in ("capabilities", "resources", "settlement"):
        for key, value in data[section].items():
            shown = ", ".join(value) if isinstance(value, list) else value
            echo(f"{section + '.' + key + ':':<36}{shown if shown != '' else '-'}")
    if resource_class is not None:
        echo(f"{'resource_profile:':<36}{resource_class['profile']}: nice {resource_class['nice']}, "
             f"{resource_class['cpu_cores']:g} CPU cores, {resource_class['memory_mb']} MiB (replica and each tool process)")
    echo(f"{'keywords:':<36}{', '.join(spec.keywords) or '-'}")
    for key, value in spec.routing_hints.items():  # a Runefile's routing_hints, every key as written
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
        echo(f"{'routing_hints.' + key + ':':<36}{shown}")
    if "state" in data:
        waiting = f" (its manifest is rejected: runs its last valid version until {data['waiting_on']} loads again)" \
            if data["state"] == "snapshot" else ""
        echo(f"{'state:':<36}{data['state']}{waiting}")
    if data.get("stopped"):
        echo(f"{'stopped:':<36}yes: its dispatches are refused until `covenant start {spec.id}`")
    if tools is not None:
        for tool in tools["offered"]:
            echo(f"{'tool:':<36}{tool['name']} ({tool['kind']} {tool['entry']}, needs {tool['action']})")
        for tool in tools["unavailable"]:
            echo(f"{'tool unavailable:':<36}{tool['tool']}: {tool['reason']}")
        if "error" in tools:
            echo(f"warning: cannot read the package's tools: {tools['error']}")
    for warning in spec.warnings:
        echo(f"warning: {warning}")


@agents.command("check")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Stable JSON: {valid, agents, problems, warnings, notes}.")
@pass_cli
@reports_errors
def check(cli: CliContext, paths: tuple[Path, ...], as_json: bool) -> None:
    """Validate manifests: files, package folders or agents folders (default: the home's).

    Prints one line per problem, `path:line: field: message`, on stdout;
    warnings and info notes (files ignored because they are not manifests)
    go to stderr and never count as problems. Exits 0 when everything is
    valid and 1 otherwise.
    """
    # Always the files, never the daemon: a check must see an edit the daemon has not reloaded yet.
    from covenant.config import load_config
    from covenant.tools.refuse import enforce_unavailable_policy

    config = load_config(cli.home)
    runtime = config.runtime
    limits = ManifestLimits.from_config(runtime)
    registry = check_paths(list(paths), limits) if paths else scan_agents(cli.home.agents_dir, limits)
    registry = enforce_unavailable_policy(registry, config)
    warnings = [(s.manifest_path, w) for s in registry.agents.values() for w in s.warnings]
    for agent_id, package in registry.rune_packages.items():
        for tool in _tools(package, config)["unavailable"]:
            warnings.append(
                (
                    registry.agents[agent_id].manifest_path,
                    f"tool {tool['tool']} is unavailable here ({tool['reason']}): it is never offered to the model",
                )
            )
    if as_json:
        print_json(
            {
                "valid": not registry.problems,
                "agents": sorted(registry.agents),
                "problems": [p.to_json() for p in registry.problems],
                "warnings": [{"path": str(path), "message": w} for path, w in sorted(warnings)],
                "notes": [n.to_json() for n in registry.notes],
            }
        )
    else:
        if registry.problems:
            echo("\n".join(str(p) for p in registry.problems))
        for path, warning in sorted(warnings):
            echo(f"{path}: warning: {warning}", err=True)
        for note in registry.notes:
            echo(str(note), err=True)
        rejected = sum(1 for v in registry.sources.values() if v is None)
        echo(
            f"{len(registry.sources)} manifest(s): {len(registry.agents)} valid, {rejected} rejected, "
            f"{len(registry.problems)} problem(s)",
            err=True,
        )
    sys.exit(1 if registry.problems else 0)
