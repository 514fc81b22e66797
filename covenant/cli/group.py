"""The click group behind ``covenant``: loads each subcommand's module only when it runs."""

from __future__ import annotations

import importlib

import click

from covenant import __version__
from covenant.cli._common import CliContext

__all__ = ["LazyGroup", "cli"]

# name -> ("module:attribute", short help). Short help lives here so that
# `covenant --help` does not import every command module.
_COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("covenant.cli.init_cmd:init", "Create the home: layout, daemon key, user identity."),
    "daemon": ("covenant.cli.daemon_cmd:daemon", "Run the supervisor daemon in the foreground."),
    "dispatch": ("covenant.cli.dispatch_cmd:dispatch", "Sign an intent and send it to the daemon."),
    "run": ("covenant.cli.run_cmd:run", "Run one manifest or Rune package once, without a daemon."),
    "agents": ("covenant.cli.agents_cmd:agents", "List, show and check agent manifests."),
    "tools": ("covenant.cli.tools_cmd:tools", "List Rune agents' tools: capability, available or not and why."),
    "grant": ("covenant.cli.grants_cmd:grant", "Grant capability actions to an issuer."),
    "revoke": ("covenant.cli.grants_cmd:revoke", "Revoke capability actions from an issuer."),
    "grants": ("covenant.cli.grants_cmd:grants", "List grants and report any that do not verify."),
    "identity": ("covenant.cli.identity_cmd:identity", "Manage your signing identity and known issuers."),
    "audit": ("covenant.cli.audit_cmd:audit", "Tail, verify and witness the signed audit log."),
    "status": ("covenant.cli.status_cmd:status", "Show the daemon's status, or one agent's (exit 5 when unreachable)."),
    "reload": ("covenant.cli.status_cmd:reload", "Ask the daemon to reload covenant.toml, manifests and grants."),
    "stop": ("covenant.cli.control_cmd:stop", "Stop an agent: its dispatches are refused until `start`."),
    "start": ("covenant.cli.control_cmd:start", "Start a stopped agent again."),
    "restart": ("covenant.cli.control_cmd:restart", "Restart an agent: a Rune replica afresh, others reloaded from disk."),
    "sessions": ("covenant.cli.sessions_cmd:sessions", "List, show, verify and remove Rune sessions."),
    "logs": ("covenant.cli.logs_cmd:logs", "Show or follow the daemon's log."),
    "tail": ("covenant.cli.logs_cmd:tail", "Show an agent's last log lines (its stderr too); -f follows."),
    "history": ("covenant.cli.history_cmd:history", "List recent dispatch records."),
    "show": ("covenant.cli.history_cmd:show", "Show one dispatch record by intent id."),
    "schedules": ("covenant.cli.schedules_cmd:schedules", "List schedules with their next and last runs."),
    "a2a": ("covenant.cli.a2a_cmd:a2a", "Show the A2A card an exposed agent is served with."),
    "network-setup": ("covenant.cli.network_cmd:network_setup", "Write the nftables table that keeps agents off the host."),
    "fleet": ("covenant.cli.fleet_cmd:fleet", "Run this host's fleet process (NATS JetStream); fleet status, fleet show."),
    "completion": ("covenant.cli.completion_cmd:completion", "Print the shell completion script (bash, zsh, fish)."),
}



class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target[0].split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, short) in _COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})  # every subcommand inherits -h
@click.option(
    "--home",
    # not readable=True: a shared home is 0711 (traversable, not listable) for users other than its owner
    type=click.Path(file_okay=False, readable=False),
    envvar="COVENANT_HOME",
    help="The covenant home (default: $COVENANT_HOME, else ~/.covenant).",
)
@click.version_option(__version__, prog_name="covenant")
@click.pass_context
def cli(ctx: click.Context, home: str | None) -> None:
    """covenant: supervise agents under hard limits, with a signed audit trail.

    Exit codes of dispatch and run: 0 ok, 1 agent answered status error,
    2 usage or configuration error, 3 denied, 4 agent failed,
    5 daemon unreachable or shutting down, 6 no agent matched, ambiguous,
    withdrawn or stopped (`covenant stop`).
    """
    ctx.obj = CliContext.from_option(home)
