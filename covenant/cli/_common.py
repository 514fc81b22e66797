"""Helpers every CLI command shares: the context object and error reporting.

``echo``, ``fail`` and ``print_json`` live in the click-free :mod:`covenant.cli._output`
(re-exported here) so the fast ``covenant dispatch`` path renders the same way.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click

from covenant.cli._output import echo, fail, print_json, table_lines
from covenant.errors import CovenantError
from covenant.home import Home

if TYPE_CHECKING:
    from covenant.client import DaemonClient

__all__ = ["CliContext", "pass_cli", "reports_errors", "echo", "fail", "print_json", "table_lines", "ask_daemon",
           "daemon_client"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CliContext:
    home: Home

    @classmethod
    def from_option(cls, home: str | None) -> "CliContext":
        return cls(home=Home.resolve(home))


pass_cli = click.make_pass_decorator(CliContext)


def reports_errors(func: F) -> F:
    """Turn a CovenantError raised by library code into a message and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except CovenantError as exc:
            fail(exc.message, exc.exit_code)

    return wrapper  # type: ignore[return-value]


def daemon_client(home: Home, timeout: float | None = None) -> DaemonClient:
    """A client of ``home``'s daemon, whose "not running" hint names that home."""
    from covenant.client import DaemonClient

    return DaemonClient(home.socket_path, timeout=timeout, home=home.root)


def ask_daemon(home: Home, path: str) -> Any | None:
    """GET ``path`` from the running daemon, or None when none answers.

    Read-only commands prefer what the daemon has loaded and fall back to
    reading the home's files when no daemon runs.
    """
    from covenant.client import DaemonUnreachable

    try:
        with daemon_client(home, timeout=30) as client:
            return client.request("GET", path)
    except DaemonUnreachable:
        return None
