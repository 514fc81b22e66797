"""Errors shared across covenant's layers.

Library code raises these; only the CLI turns them into messages and exit
codes. Each carries a stable ``code`` (the API error code) and an exit code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "CovenantError",
    "ConfigError",
    "ConfigProblems",
    "KeyFileError",
    "ExitCode",
    "error_document",
]


def error_document(code: str, message: str, **details: Any) -> dict[str, Any]:
    """The one shape of an error on every covenant wire: ``{"error": {"code", "message", ...details}}``."""
    return {"error": {"code": code, "message": message, **details}}


class ExitCode:
    """Exit codes of ``covenant dispatch`` and ``covenant run`` (DESIGN.md §7)."""

    OK = 0
    AGENT_ERROR = 1
    USAGE = 2
    DENIED = 3
    AGENT_FAILED = 4
    UNREACHABLE = 5
    NO_AGENT = 6


class CovenantError(Exception):
    """Base class: a failure an operator can act on.

    ``code`` is the machine-readable error code used on the wire,
    ``exit_code`` what the CLI exits with, ``http_status`` what the control
    API answers with, ``details`` extra JSON fields, ``retry_after_s`` (when
    set) the ``Retry-After`` header of that answer.
    """

    code = "error"
    exit_code = ExitCode.USAGE
    http_status = 400
    retry_after_s: int | None = None

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict[str, Any]:
        return error_document(self.code, self.message, **self.details)


class ConfigError(CovenantError):
    """covenant.toml, the home layout or a command-line value is wrong."""

    code = "config_error"


class ConfigProblems:
    """Gathers the ConfigErrors of several checks, so one pass names every problem instead of the first.

    Example::

        problems = ConfigProblems()
        for schedule in schedules:
            with problems.gathered():
                check(schedule)
        problems.raise_any()
    """

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """Run the block; a ConfigError it raises is kept (and the block ends there), not raised."""
        try:
            yield
        except ConfigError as exc:
            self.errors.append(exc)

    def raise_any(self) -> None:
        """Raise the one problem as it is, or one ConfigError whose message lists them all, a line each."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise ConfigError("\n".join(error.message for error in self.errors),
                              problems=[{"message": e.message, **e.details} for e in self.errors])


class KeyFileError(CovenantError):
    """A key file is missing, malformed, a symlink, or readable by others."""

    code = "key_error"
