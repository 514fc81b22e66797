"""Errors raised by the audit log."""

from __future__ import annotations

from covenant.errors import CovenantError, ExitCode

__all__ = ["AuditUnavailable", "AuditDataError", "AuditLogError"]


class AuditUnavailable(CovenantError):
    """The audit log cannot be written: covenant refuses to act until it can (fail closed)."""

    code = "audit_unavailable"
    exit_code = ExitCode.UNREACHABLE
    http_status = 503


class AuditDataError(CovenantError):
    """An event's type or data cannot be recorded as given (float, bad type name, ...)."""

    code = "audit_bad_data"


class AuditLogError(CovenantError):
    """The log on disk cannot be opened as it is (wrong key, damage before its tail, ...)."""

    code = "audit_log_error"
    exit_code = ExitCode.UNREACHABLE
    http_status = 503
