"""Errors raised by the audit log."""

from __future__ import annotations

from covenant.errors import CovenantError, ExitCode

__all__ = ["AuditUnavailable", "AuditDataError", "AuditEventReplaced", "AuditLogError"]


class AuditUnavailable(CovenantError):
    """The audit log cannot be written: covenant refuses to act until it can (fail closed)."""

    code = "audit_unavailable"
    exit_code = ExitCode.UNREACHABLE
    http_status = 503


class AuditDataError(CovenantError):
    """An event's type or data cannot be recorded as given (float, bad type name, ...)."""

    code = "audit_bad_data"


class AuditEventReplaced(AuditDataError):
    """Events of a call could not be encoded: each was recorded as ``audit.error`` in its place, the rest of
    the call (its other events, its dispatch record) was written, and the call fails.

    ``replaced`` names the types of the events replaced. The dispatch that wrote them fails with this
    error, its completion recorded (docs/audit.md, ``audit.error``): never a gap in its record.
    """

    code = "audit_error"
    exit_code = ExitCode.AGENT_FAILED
    http_status = 500

    def __init__(self, message: str, *, replaced: tuple[str, ...], **details: object) -> None:
        super().__init__(message, **details)
        self.replaced = replaced


class AuditLogError(CovenantError):
    """The log on disk cannot be opened as it is (wrong key, damage before its tail, ...)."""

    code = "audit_log_error"
    exit_code = ExitCode.UNREACHABLE
    http_status = 503
