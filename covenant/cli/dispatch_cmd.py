"""``covenant dispatch``: sign an intent with your identity and send it to the daemon.

The click command, for help, usage errors and anything the fast path of
:func:`covenant.cli.main.main` hands over. Its options are built from
:data:`covenant.cli.dispatch_args.DISPATCH_OPTIONS` and the work is
:func:`covenant.cli.dispatch_run.dispatch_and_exit`, both shared with that path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from covenant.cli._common import CliContext, pass_cli
from covenant.cli.dispatch_args import DISPATCH_OPTIONS, TEXT_ARGUMENT
from covenant.cli.dispatch_run import dispatch_and_exit

__all__ = ["dispatch"]


def _with_dispatch_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Apply the shared option table as click decorators, in table order."""
    for option in reversed(DISPATCH_OPTIONS):
        if option.is_flag:
            func = click.option(option.flag, option.dest, is_flag=True, help=option.help)(func)
        elif option.choices is not None:
            func = click.option(option.flag, option.dest, type=click.Choice(list(option.choices)),
                                default=option.default, show_default=True, help=option.help)(func)
        else:
            func = click.option(option.flag, option.dest, metavar=option.metavar, default=option.default,
                                help=option.help)(func)
    return click.argument(TEXT_ARGUMENT)(func)


@click.command()
@_with_dispatch_options
@pass_cli
def dispatch(cli: CliContext, text: str, agent_id: str | None, priority: str, parent: str | None,
             as_json: bool, dry_run: bool, session_id: str | None, stream: bool, fleet: bool,
             timeout: str | None) -> None:
    """Sign TEXT with your identity and have the daemon run it.

    Exit codes: 0 ok, 1 the agent answered status error, 2 usage or
    configuration error, 3 denied (capability, budget, signature), 4 the agent
    failed (timeout, killed, crashed, protocol error, output too large; Rune
    agents also token_budget_exceeded, max_steps_exceeded, provider_error,
    provider_unavailable, session_corrupt, session_suspicious, unsafe_output,
    tests_exhausted), 5 the daemon is
    unreachable, overloaded or shutting down, 6 no agent matched or the match
    is ambiguous. A session of another issuer (session_forbidden) exits 3.

    With --fleet the intent goes over NATS to a live host that runs the agent
    (docs/fleet.md); the codes are the same, 5 also when NATS is unreachable or
    no live host runs the agent, 4 for delivery_exhausted.
    """
    dispatch_and_exit(str(cli.home.root), text, agent_id, priority, parent, as_json, dry_run, session_id, stream,
                      fleet, timeout)
