"""Policy errors: why an intent was refused, with the code the API and CLI use.

Light on purpose (``covenant dispatch`` maps these codes back to exit codes):
only :mod:`covenant.errors` is imported.

| class            | code                | HTTP | exit |
|------------------|---------------------|------|------|
| BadIntent        | bad_intent          | 400  | 2    |
| PolicyDenied     | capability_denied   | 403  | 3    |
| BadSignature     | bad_signature       | 401  | 3    |
| StaleIntent      | stale_intent        | 401  | 3    |
| ReplayedIntent   | replayed_intent     | 409  | 3    |
| BudgetExhausted  | budget_exhausted    | 429  | 3    |
| UnknownIdentity  | unknown_identity    | 404  | 2    |
| IdentityError    | identity_error      | 400  | 2    |
| GrantError       | grant_error         | 400  | 2    |
"""

from __future__ import annotations

from covenant.errors import CovenantError, ExitCode

__all__ = [
    "BadIntent",
    "PolicyDenied",
    "BadSignature",
    "StaleIntent",
    "ReplayedIntent",
    "BudgetExhausted",
    "UnknownIdentity",
    "IdentityError",
    "GrantError",
    "ERROR_CLASSES",
]


class BadIntent(CovenantError):
    """The dispatch body is malformed: not an intent of the right shape.

    A usage error, not a denial: nothing about the issuer was judged.
    """

    code = "bad_intent"
    exit_code = ExitCode.USAGE
    http_status = 400


class PolicyDenied(CovenantError):
    """The issuer may not make this agent run (missing capability actions).

    Details: ``missing``, ``required``, ``hint`` (the `covenant grant …` command).
    Subclasses are the other denials; all exit 3.
    """

    code = "capability_denied"
    exit_code = ExitCode.DENIED
    http_status = 403


class BadSignature(PolicyDenied):
    """The intent's signature does not verify against its issuer's public key."""

    code = "bad_signature"
    http_status = 401


class StaleIntent(PolicyDenied):
    """``issued_at`` is outside the accepted clock-skew window (past or future)."""

    code = "stale_intent"
    http_status = 401


class ReplayedIntent(PolicyDenied):
    """An intent with this id was already accepted (or could not be proven fresh)."""

    code = "replayed_intent"
    http_status = 409


class BudgetExhausted(PolicyDenied):
    """The agent spent its rolling one-hour budget. Details: ``frees_at_ms``, ``frees_at``."""

    code = "budget_exhausted"
    http_status = 429


class UnknownIdentity(CovenantError):
    """A name is neither a public key nor a display name this home knows."""

    code = "unknown_identity"
    exit_code = ExitCode.USAGE
    http_status = 404


class IdentityError(CovenantError):
    """An identity file or value is wrong (display name, identity.toml, identities.toml)."""

    code = "identity_error"
    exit_code = ExitCode.USAGE
    http_status = 400


class GrantError(CovenantError):
    """A grant request or grants.toml itself is wrong (bad action, wrong key, unreadable file)."""

    code = "grant_error"
    exit_code = ExitCode.USAGE
    http_status = 400


ERROR_CLASSES: dict[str, type[CovenantError]] = {
    cls.code: cls
    for cls in (
        BadIntent,
        PolicyDenied,
        BadSignature,
        StaleIntent,
        ReplayedIntent,
        BudgetExhausted,
        UnknownIdentity,
        IdentityError,
        GrantError,
    )
}
"""Error code -> class, so a client can rebuild the right exit code from an API error."""
