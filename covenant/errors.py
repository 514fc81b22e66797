"""Errors shared across covenant's layers.

Library code raises these; only the CLI turns them into messages and exit
codes. Each carries a stable ``code`` (the API error code) and an exit code.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CovenantError",
    "ConfigError",
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


class KeyFileError(CovenantError):
    """A key file is missing, malformed, a symlink, or readable by others."""

    code = "key_error"
