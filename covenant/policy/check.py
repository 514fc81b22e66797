"""The capability check: may this issuer make this agent run? Pure, no I/O.

Allowed only when every ``required`` action of the agent is covered by an
active grant of the issuer's public key. ``optional`` actions are looked up
and recorded, never enforced. An agent that requires nothing may be run by
any issuer whose intent verified (signature, skew, replay): the check is
about capabilities, and such an agent asks for none.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from covenant.manifest.model import AgentSpec
from covenant.policy.errors import PolicyDenied
from covenant.policy.grants import GrantSet

__all__ = ["Decision", "check_capabilities", "grant_hint"]


def grant_hint(issuer: str, actions: list[str]) -> str:
    """The command that would grant ``actions`` to ``issuer`` (a known display name or a pubkey)."""
    return " ".join(["covenant", "grant", shlex.quote(issuer), *(shlex.quote(a) for a in actions)])


@dataclass(frozen=True)
class Decision:
    """The outcome of one capability check, as recorded in the ``policy.decision`` audit event."""

    allowed: bool
    agent: str
    issuer: str
    issuer_display: str | None
    required: list[str]
    optional: list[str]
    granted: list[str]
    """Required actions covered by an active grant."""
    missing: list[str]
    """Required actions not covered: the reason for a denial."""
    optional_granted: list[str]
    matched_grants: dict[str, list[str]] = field(default_factory=dict)
    """Action (required or optional) -> ids of the grants that covered it."""
    hint: str | None = None
    """``covenant grant …`` for the missing actions; None when allowed."""

    def to_audit(self) -> dict[str, Any]:
        """Strings, integers, booleans and lists only (canonical JSON, no floats)."""
        return {
            "decision": "allow" if self.allowed else "deny",
            "allowed": self.allowed,
            "agent": self.agent,
            "issuer": self.issuer,
            "issuer_display": self.issuer_display,
            "required": list(self.required),
            "optional": list(self.optional),
            "granted": list(self.granted),
            "missing": list(self.missing),
            "optional_granted": list(self.optional_granted),
            "matched_grants": [
                {"action": action, "grants": list(ids)} for action, ids in sorted(self.matched_grants.items())
            ],
            "hint": self.hint,
        }

    def raise_if_denied(self) -> None:
        """Raise PolicyDenied naming the missing actions and the grant command."""
        if self.allowed:
            return
        who = f"{self.issuer_display} ({self.issuer})" if self.issuer_display else self.issuer
        raise PolicyDenied(
            f"issuer {who} may not run agent {self.agent}: missing {', '.join(self.missing)} "
            f"(an operator can allow it with: {self.hint})",
            agent=self.agent,
            issuer=self.issuer,
            required=list(self.required),
            granted=list(self.granted),
            missing=list(self.missing),
            hint=self.hint,
        )


def check_capabilities(
    issuer_pubkey: str,
    agent: AgentSpec,
    grants: GrantSet,
    now_ms: int,
    *,
    issuer_display: str | None = None,
) -> Decision:
    """Decide whether ``issuer_pubkey`` holds every action ``agent`` requires at ``now_ms``.

    ``issuer_display`` is only used in the hint and messages; pass the name
    this home knows the key by (``KnownIdentities.display_for``), never the
    unverified display from the intent, else the hint would grant by a name
    the home cannot resolve. Without it the hint names the public key.
    """
    required = list(dict.fromkeys(agent.capabilities.required))
    optional = list(dict.fromkeys(agent.capabilities.optional))
    matched: dict[str, list[str]] = {}
    granted, missing, optional_granted = [], [], []
    for action in required:
        covering = grants.covering(issuer_pubkey, action, now_ms)
        if covering:
            granted.append(action)
            matched[action] = [g.id for g in covering]
        else:
            missing.append(action)
    for action in optional:
        covering = grants.covering(issuer_pubkey, action, now_ms)
        if covering:
            optional_granted.append(action)
            matched[action] = [g.id for g in covering]
    allowed = not missing
    return Decision(
        allowed=allowed,
        agent=agent.id,
        issuer=issuer_pubkey,
        issuer_display=issuer_display,
        required=required,
        optional=optional,
        granted=granted,
        missing=missing,
        optional_granted=optional_granted,
        matched_grants=matched,
        hint=None if allowed else grant_hint(issuer_display or issuer_pubkey, missing),
    )
