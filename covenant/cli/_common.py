"""Helpers every CLI command shares: the context object and error reporting."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, TypeVar

import click

from covenant.errors import CovenantError
from covenant.home import Home

__all__ = ["CliContext", "pass_cli", "reports_errors", "fail", "print_json", "ask_daemon"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CliContext:
    home: Home

    @classmethod
    def from_option(cls, home: str | None) -> "CliContext":
        return cls(home=Home.resolve(home))


pass_cli = click.make_pass_decorator(CliContext)


def fail(message: str, exit_code: int) -> NoReturn:
    """Print ``covenant: error: message`` to stderr and exit."""
    click.echo(f"covenant: error: {message}", err=True)
    sys.exit(exit_code)


def reports_errors(func: F) -> F:
    """Turn a CovenantError raised by library code into a message and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except CovenantError as exc:
            fail(exc.message, exc.exit_code)

    return wrapper  # type: ignore[return-value]


def print_json(obj: Any) -> None:
    """Stable JSON for --json output: sorted keys, one document, trailing newline."""
    click.echo(json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, default=str))


def ask_daemon(home: Home, path: str) -> Any | None:
    """GET ``path`` from the running daemon, or None when none answers.

    Read-only commands prefer what the daemon has loaded and fall back to
    reading the home's files when no daemon runs.
    """
    from covenant.client import DaemonClient, DaemonUnreachable

    try:
        with DaemonClient(home.socket_path, timeout=30) as client:
            return client.request("GET", path)
    except DaemonUnreachable:
        return None
