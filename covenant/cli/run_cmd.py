"""``covenant run PATH TEXT``: run one agent once, without a daemon.

The agent author's everyday tool: the same runner, limits and dispatch
record as the daemon; the record is appended to the home's dispatch store.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click

from covenant.cli._common import CliContext, echo, pass_cli, print_json, reports_errors

__all__ = ["run", "local_issuer", "run_once"]


def local_issuer() -> dict[str, str]:
    """The user's identity if one exists (never created here), else ``$USER@host`` with no key."""
    from covenant.errors import CovenantError
    from covenant.home import user_identity_path
    from covenant.policy.identities import default_display, load_user_identity

    if user_identity_path().exists():
        try:
            identity = load_user_identity()
            return {"display": identity.display, "pubkey": identity.pubkey}
        except CovenantError:
            pass  # an unreadable key does not stop an offline test run
    return {"display": default_display(), "pubkey": ""}


class _StderrEcho(logging.Handler):
    """Shows the agent's stderr lines live, as the author would see them in the daemon log."""

    def emit(self, record: logging.LogRecord) -> None:
        line = getattr(record, "line", None)
        if line is not None:
            sys.stderr.write(f"[{getattr(record, 'agent', '?')}] {line}\n")


def run_once(cli: CliContext, path: Path, text: str) -> Any:
    """Load, run and record one dispatch; returns the DispatchRecord."""
    import trio

    from covenant.config import load_config
    from covenant.errors import ConfigError
    from covenant.manifest.limits import ManifestLimits
    from covenant.manifest.registry import load_path
    from covenant.runtime.host import set_child_subreaper
    from covenant.runtime.isolation import open_isolation, reachability_problems
    from covenant.runtime.records import DispatchStore
    from covenant.runtime.runner import Runner, paths_agent_processes_run

    config = load_config(cli.home)
    agent = load_path(path, ManifestLimits.from_config(config.runtime))
    # Run as root, the agent runs as its own unprivileged uid, exactly as under the daemon.
    isolation = open_isolation(config.isolation, cli.home.state_dir)
    needs = []
    if agent.entry is not None:
        kind = "file" if agent.runtime == "rust-bin" else "read"
        needs.append((str(agent.entry), kind, "nothing: move the package where agent uids can read it"))
    if agent.runtime == "rune":  # the loop runs here; its process tools run as the agent's uid
        from covenant.manifest.runefile import load_rune_package

        for tool in load_rune_package(agent.root).tools.values():
            if tool.runtime == "process" and tool.module:
                needs.append((str(agent.root / tool.module), "read",
                              "nothing: move the package where agent uids can read it"))
    unreachable = reachability_problems(needs, isolation)
    if unreachable:
        raise ConfigError(f"agent {agent.id}: " + "; ".join(unreachable), path=str(agent.root))
    payload = {
        "id": str(uuid.uuid4()),
        "text": text,
        "issuer": local_issuer(),
        "issued_at": int(time.time() * 1000),
        "priority": agent.settlement.priority,
        "parent": None,
    }
    try:
        # Escaped grandchildren then come back to us and are killed and reaped.
        set_child_subreaper()
    except OSError:
        pass

    async def main() -> Any:
        async with Runner.open(config.runtime, scratch_root=cli.home.state_dir / "scratch", isolation=isolation,
                               visible=paths_agent_processes_run(config), rune=config.rune) as runner:
            if agent.runtime == "rune":
                return await _run_rune(cli, agent, text, config, runner, payload["issuer"]["pubkey"])
            return await runner.run(agent, payload)

    try:
        record = trio.run(main)
    except BaseExceptionGroup as group:  # Ctrl-C, grouped on its way out of the runner's nurseries
        interrupted, other = group.split(KeyboardInterrupt)
        if interrupted is None or other is not None:
            raise
        raise KeyboardInterrupt from None  # click's "Aborted!", exit 1, as for `covenant dispatch`
    DispatchStore(cli.home.dispatches_dir).append(record)
    return record


async def _run_rune(cli: CliContext, agent: Any, text: str, config: Any, runner: Any, issuer: str) -> Any:
    """A Rune package: its loop in this process (covenant.rune.local_run), with every tool of its toolset allowed."""
    import trio

    from covenant.manifest.runefile import load_rune_package
    from covenant.policy.grants import Grant, GrantSet
    from covenant.rune.local_run import run_package

    package = await trio.to_thread.run_sync(load_rune_package, agent.root)
    # The operator running the package locally is its only issuer: every tool of its toolset is allowed.
    everything = GrantSet(grants=(Grant(issuer, "tool.*", 0, None, None, ""),))
    return await run_package(agent, package, text, home=cli.home, config=config, runner=runner, issuer=issuer,
                             grants=everything, warn=lambda note: echo(f"covenant: {agent.id}: {note}", err=True))


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.argument("text")
@click.option("--json", "as_json", is_flag=True, help="Print the full dispatch record as JSON.")
@pass_cli
@reports_errors
def run(cli: CliContext, path: Path, text: str, as_json: bool) -> None:
    """Run the agent at PATH (a manifest, or a folder with agent.toml or a Runefile) once with TEXT.

    A Rune package runs its model loop in this process: providers from the
    home's covenant.toml, keys from this command's own environment, its MCP
    servers connected for the run, the same limits and outcomes as under the
    daemon (a daemon may be running). Toolset entries the model is not offered
    are named on stderr, with the reason.

    Prints the agent's answer (or the full record with --json). Exit codes:
    0 ok, 1 the agent answered status error, 2 bad manifest or configuration,
    4 the agent failed (timeout, limit, crash, protocol error, no result;
    Rune: token_budget_exceeded, max_steps_exceeded, provider_error,
    provider_unavailable, unsafe_output). Ctrl-C kills the agent and all it
    started, records nothing and exits 1 (Aborted!).
    """
    from covenant.runtime.outcome import outcome_exit_code

    # The outcome is reported below; keep library warnings off the terminal.
    logging.getLogger("covenant").addHandler(logging.NullHandler())
    agent_log = logging.getLogger("covenant.agent")
    if not as_json:
        agent_log.addHandler(_StderrEcho())
        agent_log.setLevel(logging.INFO)
    record = run_once(cli, path, text)
    if as_json:
        print_json(record.model_dump(mode="json"))
    elif record.result is not None:
        echo(record.result["text"])
    if record.outcome not in ("ok",) and record.error:
        echo(f"covenant: {record.agent_id}: {record.outcome}: {record.error}", err=True)
    sys.exit(outcome_exit_code(record.outcome))
