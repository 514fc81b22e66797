"""``covenant status`` and ``covenant reload``: ask the running daemon (``status AGENT``: :mod:`.control_cmd`)."""

from __future__ import annotations

import sys

import click

from covenant.cli._common import CliContext, daemon_client, echo, pass_cli, print_json, reports_errors
from covenant.clock import iso_ms, now_ms

__all__ = ["status", "reload"]


def _render_status(doc: dict) -> None:
    audit = doc["audit"]
    echo(f"covenant {doc['version']}  pid {doc['pid']}  up {doc['uptime_s']} s  home {doc['home']}")
    echo(f"socket     {', '.join(doc['sockets'])}")
    state = "shutting down" if doc["shutting_down"] else "serving"
    echo(f"state      {state}; {len(doc['in_flight'])} in flight, {doc['queued']} queued "
               f"(max {doc['limits']['max_concurrent']} concurrent, queue {doc['limits']['queue_max']})")
    echo(f"agents     {len(doc['agents']['loaded'])} loaded: {', '.join(doc['agents']['loaded']) or '-'}")
    if doc["agents"]["withdrawn"]:
        echo(f"           withdrawn until their manifest is fixed: {', '.join(doc['agents']['withdrawn'])}")
    for agent_id, path in doc["agents"].get("snapshot", {}).items():
        echo(f"           {agent_id} runs its last valid version (snapshot) until {path} loads again")
    if doc["agents"].get("stopped"):
        echo(f"           stopped until `covenant start`: {', '.join(doc['agents']['stopped'])}")
    for problem in doc["rejected"]:
        where = problem["path"] + (f":{problem['line']}" if problem.get("line") else "")
        echo(f"rejected   {where}: {problem['message']}")
    health = "ok" if audit["healthy"] else f"FAILING: {audit['failure']}"
    age = f", last checkpoint {audit['checkpoint_age_ms'] // 1000} s ago" if audit.get("checkpoint_age_ms") is not None else ""
    echo(f"audit      {health}; head seq {audit['head_seq']}{age}")
    echo(f"network    isolation {'available' if doc.get('network_isolation') else 'NOT available'} on this host")
    detail = doc.get("isolation_detail") or {}
    if doc.get("isolation") == "uid" and "user" in detail:
        echo(f"isolation  uid: every agent runs as uid {detail['user']['uid']} ([isolation] user), "
                   "one account shared by all agents")
    elif doc.get("isolation") == "uid":
        echo("isolation  uid: every agent runs as an unprivileged uid of its own")
    else:
        echo(f"isolation  same-uid: agents run as the daemon's own uid (NOT isolated: {detail.get('reason', '?')})")
    for problem in detail.get("problems", []):
        echo(f"isolation  problem: {problem}")
    network = detail.get("network") or {}
    if network.get("egress"):
        allowed = ", ".join(network.get("host_allow") or []) or "nothing"
        echo(f"network    each agent in namespaces of its own; egress never reaches the host (allowed: {allowed})")
    elif network:
        relaxed = ("agents with network run in the HOST's network ([isolation] network = \"host\")"
                   if network.get("setting") == "host" else "agents with network are refused")
        echo(f"network    no egress from agents' own namespaces ({network.get('problem') or 'same-uid'}): {relaxed}")
    files = doc.get("tool_files") or {}
    if files.get("confined_by") == "landlock":
        echo(f"tools      files confined by Landlock ABI {files['landlock_abi']}")
    elif files:
        echo(f"tools      files NOT confined ({files['problem']}): process tools are unavailable")
    share = doc.get("cpu_share") or {}
    if share.get("controller"):
        echo(f"cpu        Rune agents held to their resource_profile's CPU share ({share['controller']}: {share['parent']})")
    elif share:
        echo(f"cpu        NO CPU share for Rune agents ({share['problem']}): their resource_profile's nice only")
    for problem in doc["grants"]["problems"]:
        echo(f"grants     ignored: {problem}")
    if doc.get("config", {}).get("needs_restart"):
        echo(f"config     changed in covenant.toml, applied at the next restart: {', '.join(doc['config']['needs_restart'])}")
    _render_front_doors(doc)
    for warning in doc.get("file_modes", []):
        echo(f"files      {warning}")
    for running in doc["in_flight"]:
        echo(f"running    {running['intent']} on {running['agent']} for {running['elapsed_ms']} ms")
    for replica in doc.get("replicas", []):
        pid = replica["pid"] if replica["pid"] is not None else "-"
        line = (f"replica    {replica['agent']}: {replica['state']}, pid {pid}, {replica['in_flight']} in flight, "
                f"{replica['restarts']} restarts")
        if replica.get("spare_pid") is not None:
            line += f", warm spare pid {replica['spare_pid']}"
        if replica["last_error"]:
            line += f"; last error: {replica['last_error']}"
        echo(line)
    for server in doc.get("mcp_servers", []):
        line = f"mcp        {server['agent']} {server['server']}: {server['state']} ({server['endpoint'] or '?'})"
        if server["state"] == "up":
            line += f", {len(server['tools'])} tools advertised"
        elif server["last_error"]:
            line += f"; {server['last_error']} (attempt {server['attempts']}, retrying)"
        echo(line)


def _render_front_doors(doc: dict) -> None:
    """The webhook and A2A listeners, the schedules, the fleet, and names in covenant.toml that lead nowhere."""
    if "webhooks" not in doc:
        return  # an older daemon
    webhooks, a2a, schedules, fleet = doc["webhooks"], doc["a2a"], doc["schedules"], doc["fleet"]
    if webhooks["listen"]:
        echo(f"webhooks   listening on {webhooks['listen']}, {_count(len(webhooks['routes']), 'route')}")
    else:
        echo("webhooks   off ([webhooks] listen is not set)")
    if a2a["listen"]:
        exposed = ", ".join(a2a["expose"]) or "nothing"
        echo(f"a2a        listening on {a2a['listen']} ({a2a['url']}), exposes {exposed}; "
             f"{_count(a2a['clients'], 'client')}")
    else:
        echo("a2a        off ([a2a] listen is not set)")
    upcoming = schedules["next"]
    if upcoming is None:
        echo("schedules  none")
    else:
        in_s = max(0, (upcoming["at_ms"] - now_ms()) // 1000)
        echo(f"schedules  {schedules['count']}; next {upcoming['name']} ({upcoming['agent']}) at "
             f"{iso_ms(upcoming['at_ms'])[:19]}Z UTC, in {in_s} s")
    if not fleet["configured"]:
        echo("fleet      off ([fleet] servers is not set)")
    else:
        line = f"fleet      host {fleet['host']}, {_count(fleet['servers'], 'NATS server')}; "
        process = fleet["process"]
        if process is None:
            line += "no covenant fleet process has asked this daemon since it started (is `covenant fleet` running?)"
        elif process["connected"]:
            line += f"covenant fleet (pid {process['pid']}) asked {process['last_seen_s']:g} s ago"
        else:
            line += f"covenant fleet (pid {process['pid']}) last asked {process['last_seen_s']:g} s ago: NOT running?"
        echo(line)
    for problem in doc.get("unknown_names", []):
        echo(f"warning    {problem}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


@click.command()
@click.argument("agent", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the status document as JSON.")
@pass_cli
@reports_errors
def status(cli: CliContext, agent: str | None, as_json: bool) -> None:
    """Show the daemon's status, or with AGENT that agent's.

    AGENT (an id or a bare name) shows its state (stopped, loaded, snapshot,
    withdrawn, removed), its file, its replica, the runs in flight and its
    last dispatch you may read. Exit 0 when the daemon answers, 5 when it
    does not, 6 when AGENT names no agent.
    """
    if agent is not None:
        from covenant.cli.control_cmd import show_agent_status

        show_agent_status(cli, agent, as_json)
        return
    with daemon_client(cli.home, timeout=10) as client:
        doc = client.request("GET", "/v1/status")
    if as_json:
        print_json(doc)
    else:
        _render_status(doc)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's answer as JSON (same exit code).")
@pass_cli
@reports_errors
def reload(cli: CliContext, as_json: bool) -> None:
    """Reload covenant.toml, manifests and grants (root or the daemon's uid only).

    covenant.toml first: what can change live (providers, MCP servers,
    tools, channels, schedules, webhook routes, A2A clients and expose,
    default_agent) is applied and listed under "config changed"; a key that
    cannot (listen addresses, [runtime], [isolation], ...) is listed as
    needing a restart and keeps its running value. A file that does not
    load is named with its line and nothing of it is applied.

    Then names every rejected manifest; the others reload. An agent whose manifest
    was valid and is rejected now keeps running its last valid version, from
    the snapshot taken when it loaded (listed under "snapshot"), until the file
    loads again; one with no snapshot is withdrawn. "changed" lists agents
    whose manifest, package files (tools/, workflow.yaml, code) or skills
    differ. Exit 0 when covenant.toml and every manifest are valid, 1 when
    covenant.toml or any manifest was rejected, 5 when no daemon answers.
    """
    with daemon_client(cli.home, timeout=60) as client:
        doc = client.request("POST", "/v1/reload")
    config = doc.get("config") or {"changed": [], "needs_restart": [], "error": None}  # an older daemon: none
    if as_json:
        print_json(doc)
    else:
        if config["error"]:
            echo(f"covenant: covenant.toml not applied, the running config is kept:\n{config['error']}", err=True)
        if config["changed"]:
            echo(f"config changed: {', '.join(config['changed'])}")
        if config["needs_restart"]:
            echo(f"config needs a restart to apply: {', '.join(config['needs_restart'])} "
                 "(the running values stay until the daemon restarts)")
        echo(f"reloaded: {len(doc['agents'])} agents")
        for key in ("added", "removed", "changed", "withdrawn", "snapshot"):
            if doc.get(key):
                echo(f"  {key}: {', '.join(doc[key])}")
        for path in doc["rejected"]:
            echo(f"  rejected: {path}")
        for problem in doc["problems"]:
            echo(f"  problem: {problem}")
        if doc["rejected"]:
            echo(
                f"covenant: {len(doc['rejected'])} manifest(s) rejected, every other manifest reloaded; an agent "
                "whose file is rejected keeps running its last valid version (snapshot) where it has one. Fix them "
                "(`covenant agents check` lists the problems), then reload again",
                err=True,
            )
    sys.exit(1 if doc["rejected"] or config["error"] else 0)
