"""The supervisorctl verbs: ``covenant stop|start|restart AGENT`` and ``covenant status AGENT``.

AGENT is an id or a bare name, as ``dispatch --agent`` takes (the daemon resolves it by the one rule of
:mod:`covenant.agent_names`; exit 6 when it names no agent). Stop, start and restart are administrative
calls: root or the daemon's uid only.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import click

from covenant.cli._common import CliContext, daemon_client, echo, pass_cli, print_json, reports_errors
from covenant.home import home_command

__all__ = ["stop", "start", "restart", "show_agent_status"]


def _path(agent: str, verb: str) -> str:
    """The control API path of ``verb`` on ``agent`` (quoted: a name is the user's bytes, the daemon decodes them)."""
    return f"/v1/agents/{quote(agent, safe='@')}/{verb}"


def _in_flight(doc: dict[str, Any]) -> str:
    count = len(doc["in_flight"])
    return "nothing in flight" if not count else f"{count} in flight, which will finish"


def _status_lines(doc: dict[str, Any], start_command: str) -> list[str]:
    """``covenant status AGENT`` for people; ``start_command`` is the hint that starts a stopped one."""
    agent = doc["agent"]
    kind = f" ({doc['runtime']} {doc['version']})" if doc["runtime"] else ""
    lines = [f"agent      {agent}{kind}"]
    stopped = doc["stopped"]
    if stopped is not None:
        by = f" by uid {stopped['by_uid']}" if stopped["by_uid"] is not None else ""
        lines.append(f"state      STOPPED since {stopped['at']}{by}: dispatches to it are refused; "
                     f"`{start_command}` starts it again")
    else:
        lines.append(f"state      {doc['state']}")
    registry = {
        "loaded": f"loaded from {doc['file']}",
        "snapshot": f"runs its last valid version (snapshot) until {doc['file']} loads again",
        "withdrawn": f"withdrawn: {doc['file']} was rejected and there is no valid version to run",
        "removed": "not in the agents folder (removed)",
    }.get(doc["registry"], doc["registry"])
    lines.append(f"file       {registry}")
    lines.append(f"in flight  {len(doc['in_flight'])}")
    for running in doc["in_flight"]:
        lines.append(f"running    {running['intent']} for {running['elapsed_ms']} ms")
    replica = doc.get("replica")
    if replica is not None:
        pid = replica["pid"] if replica["pid"] is not None else "-"
        line = (f"replica    {replica['state']}, pid {pid}, {replica['in_flight']} in flight, "
                f"{replica['restarts']} restarts")
        lines.append(line + (f"; last error: {replica['last_error']}" if replica["last_error"] else ""))
    last = doc["last_dispatch"]
    if last is None:
        lines.append("last       no dispatch of yours on record")
    else:
        error = f": {last['error']}" if last.get("error") else ""
        lines.append(f"last       {last['outcome']} at {last['ended_at']} ({last['duration_ms']} ms), "
                     f"intent {last['intent_id']}{error}")
    return lines


def show_agent_status(cli: CliContext, agent: str, as_json: bool) -> None:
    """``covenant status AGENT``: that agent's state, file, replica, runs in flight and last dispatch."""
    with daemon_client(cli.home, timeout=30) as client:
        doc = client.request("GET", _path(agent, "status"))
    if as_json:
        print_json(doc)
        return
    for line in _status_lines(doc, home_command(cli.home.root, f"start {doc['agent']}")):
        echo(line)


@click.command()
@click.argument("agent")
@click.option("--json", "as_json", is_flag=True, help="Print the agent's status after the stop as JSON.")
@pass_cli
@reports_errors
def stop(cli: CliContext, agent: str, as_json: bool) -> None:
    """Stop AGENT: refuse its dispatches until `covenant start` (root or the daemon's uid only).

    AGENT is an id or a bare name, as `dispatch --agent` takes. Every new
    dispatch to it (by name, keywords, default_agent, a workflow step, a
    schedule, a webhook, A2A or the fleet) is refused with `agent_stopped`
    (exit 6); keywords route to the other agents they match. Dispatches in
    flight finish; then a Rune agent's replica stops. The stop is kept in
    state/stopped-agents.json across reloads and restarts, also when the
    agent's file is removed and added again, and is audited
    (`agent.stopped`). Exit 0 (also when it was stopped already), 3 for
    another uid, 6 when AGENT names no agent.
    """
    with daemon_client(cli.home, timeout=60) as client:
        doc = client.request("POST", _path(agent, "stop"))
    if as_json:
        print_json(doc)
        return
    start_command = home_command(cli.home.root, f"start {doc['agent']}")
    if doc["changed"]:
        echo(f"stopped {doc['agent']}: new dispatches to it are refused ({_in_flight(doc)}); "
             f"`{start_command}` starts it again")
    else:
        echo(f"{doc['agent']} was already stopped (since {doc['stopped']['at']}); `{start_command}` starts it again")


@click.command()
@click.argument("agent")
@click.option("--json", "as_json", is_flag=True, help="Print the agent's status after the start as JSON.")
@pass_cli
@reports_errors
def start(cli: CliContext, agent: str, as_json: bool) -> None:
    """Start AGENT again after `covenant stop` (root or the daemon's uid only).

    It takes dispatches again at once; a Rune agent's replica starts now.
    Audited (`agent.started`). Exit 0 (also when it was not stopped), 3 for
    another uid, 6 when AGENT names no agent.
    """
    with daemon_client(cli.home, timeout=60) as client:
        doc = client.request("POST", _path(agent, "start"))
    if as_json:
        print_json(doc)
    elif doc["changed"]:
        echo(f"started {doc['agent']}: it takes dispatches again")
    else:
        echo(f"{doc['agent']} was not stopped: nothing to do")


@click.command()
@click.argument("agent")
@click.option("--json", "as_json", is_flag=True, help="Print the agent's status after the restart as JSON.")
@pass_cli
@reports_errors
def restart(cli: CliContext, agent: str, as_json: bool) -> None:
    """Restart AGENT (root or the daemon's uid only).

    AGENT is an id or a bare name, as `dispatch --agent` takes. A Rune
    agent's replica is drained (its in-flight invokes finish first; new
    ones wait) and started afresh. Any other agent has no process between
    dispatches: its restart reloads the agents folder from disk now (as
    `covenant reload` does, so other edited files load too), its next
    dispatch runs what its file says now, and runs in flight finish as they
    began. A stopped agent is refused (exit 6): `covenant start` it. Exit 6
    when AGENT names no loaded agent.
    """
    with daemon_client(cli.home, timeout=600) as client:
        doc = client.request("POST", _path(agent, "restart"))
    if as_json:
        print_json(doc)
    elif doc["restarted"] == "replica":
        replica = doc["replica"]
        echo(f"restarted the replica of {doc['agent']} (state {replica['state']}, {replica['restarts']} restarts so far)")
    elif doc["registry"] == "loaded":
        echo(f"reloaded {doc['agent']} from {doc['file']} ({_in_flight(doc)} as it began): its next dispatch runs "
             "what the file says now")
    else:
        echo(f"reloaded the agents folder: {doc['agent']} is now {doc['registry']} ({doc['file'] or 'no file'}; "
             f"{_in_flight(doc)} as it began)")
