"""The ``covenant`` command: a click-free fast path for ``dispatch``, else a lazy click group.

Subcommands are imported only when invoked, so ``covenant dispatch`` never
pays for trio, pydantic, psutil or yaml (issue 6's latency budget). A plain
``covenant [--home DIR] dispatch TEXT [options]`` does not even import click
(~30 ms): :func:`main` recognises it with :func:`covenant.cli.dispatch_args.parse_fast`
and runs it directly; everything else (help, usage errors, other commands) goes
through the click group in :mod:`covenant.cli.group`, which ``cli`` names here.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["main", "cli"]

# name -> ("module:attribute", short help). Short help lives here so that
# `covenant --help` does not import every command module.
_COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("covenant.cli.init_cmd:init", "Create the home: layout, daemon key, user identity."),
    "daemon": ("covenant.cli.daemon_cmd:daemon", "Run the supervisor daemon in the foreground."),
    "dispatch": ("covenant.cli.dispatch_cmd:dispatch", "Sign an intent and send it to the daemon."),
    "run": ("covenant.cli.run_cmd:run", "Run one manifest or Rune package once, without a daemon."),
    "agents": ("covenant.cli.agents_cmd:agents", "List, show and check agent manifests."),
    "grant": ("covenant.cli.grants_cmd:grant", "Grant capability actions to an issuer."),
    "revoke": ("covenant.cli.grants_cmd:revoke", "Revoke capability actions from an issuer."),
    "grants": ("covenant.cli.grants_cmd:grants", "List grants and report any that do not verify."),
    "identity": ("covenant.cli.identity_cmd:identity", "Manage your signing identity and known issuers."),
    "audit": ("covenant.cli.audit_cmd:audit", "Tail, verify and witness the signed audit log."),
    "status": ("covenant.cli.status_cmd:status", "Show the daemon's status (exit 5 when unreachable)."),
    "reload": ("covenant.cli.status_cmd:reload", "Ask the daemon to reload manifests and grants."),
    "logs": ("covenant.cli.logs_cmd:logs", "Show or follow the daemon's log."),
    "history": ("covenant.cli.history_cmd:history", "List recent dispatch records."),
    "show": ("covenant.cli.history_cmd:show", "Show one dispatch record by intent id."),
}


def __getattr__(name: str) -> Any:
    # `from covenant.cli.main import cli` keeps working; click is imported only then.
    if name == "cli":
        from covenant.cli.group import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    if "dispatch" in sys.argv[1:4]:  # `[--home DIR] dispatch ...`: other commands skip the fast parser
        from covenant.cli.dispatch_args import parse_fast

        fast = parse_fast(sys.argv[1:], os.environ)
        if fast is not None:
            from covenant.cli.dispatch_run import run_fast

            run_fast(fast)
    from covenant.cli.group import cli

    cli(prog_name="covenant")
