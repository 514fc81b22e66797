"""``covenant daemon``: run the supervisor in the foreground (systemd runs it this way)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from covenant.cli._common import CliContext, pass_cli, reports_errors

__all__ = ["daemon"]


@click.command()
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              help="Minimum log level (beats env COVENANT_LOG_LEVEL and covenant.toml).")
@click.option("--log-target", metavar="stderr|stdout|file:PATH",
              help="Where log lines go (beats env COVENANT_LOG_TARGET and covenant.toml).")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False),
              help="Control socket path (default: env COVENANT_SOCKET, else `socket` in covenant.toml, "
                   "else <home>/run/covenant.sock). Ignored when systemd passes a socket (LISTEN_FDS).")
@click.option("--drain-timeout", type=click.FloatRange(min=0), metavar="SECONDS",
              help="On SIGTERM, how long in-flight dispatches may finish before they are cancelled "
                   "(default: daemon.drain_timeout_s, 30).")
@pass_cli
@reports_errors
def daemon(cli: CliContext, log_level: str | None, log_target: str | None, socket_path: str | None,
           drain_timeout: float | None) -> None:
    """Run the covenant daemon in the foreground until SIGTERM or SIGINT.

    SIGHUP reloads covenant.toml (what cannot change live is named as needing
    a restart), manifests and grants. SIGTERM stops accepting dispatches and
    drains the in-flight ones; exit status 0 after a clean drain, 5 when the
    drain timed out and dispatches were cancelled. A second SIGTERM cancels at once.
    Exit 2 for a configuration error (every problem of covenant.toml is named,
    a line each), and when a daemon already serves this home (its pid is named;
    this one binds nothing).
    """
    from covenant.daemon.logstream import LogBroadcaster
    from covenant.daemon.main import DaemonOptions, run_daemon
    from covenant.daemon.start_config import load_start_config
    from covenant.logs import resolve_log_settings, setup_logging

    home = cli.home
    start = load_start_config(home, os.environ)  # every problem of covenant.toml at once
    config = start.config
    setup_logging(resolve_log_settings(log_level, log_target, os.environ, config.log))
    broadcaster = LogBroadcaster()
    logging.getLogger("covenant").addHandler(broadcaster)
    options = DaemonOptions(
        socket_path=Path(socket_path).absolute() if socket_path else home.socket_path,
        drain_timeout_s=config.daemon.drain_timeout_s if drain_timeout is None else drain_timeout,
    )
    sys.exit(run_daemon(home, start, options, broadcaster))
