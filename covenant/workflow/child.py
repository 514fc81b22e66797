"""Child intents: what one agent (or a workflow step) asks of another, built by the daemon.

A child intent's text is the agent tool's ``input`` (or the step's rendered
``input_template``); its issuer is the root issuer, its ``parent`` the
calling intent, and it is signed with the daemon's key
(:func:`covenant.policy.intents.sign_child_intent`). It is decided like any
intent, by the root issuer's grants.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.clock import now_ms
from covenant.errors import CovenantError, ExitCode
from covenant.manifest.tools import AGENT_REF
from covenant.policy.intents import Intent, sign_child_intent
from covenant.policy.signing import MAX_TEXT_CHARS
from covenant.workflow.chain import ChainLink

__all__ = ["ChildCall", "ChildRefused", "agent_from_ref", "build_child_intent"]

class ChildRefused(CovenantError):
    """A child intent the daemon will not run before any grant is looked at.

    ``reason`` (also the error code): ``network``, ``max_depth``, ``no_parent``, ``remote_agent``, ``text_too_long``.
    """

    code = "child_refused"
    http_status = 403
    exit_code = ExitCode.DENIED

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason=reason)
        self.reason = reason
        self.code = reason  # the code callers see is the reason: network, max_depth, ...


@dataclass(frozen=True)
class ChildCall:
    """One request for a child intent."""

    parent_id: str
    agent_ref: str
    """``local://NAME`` (or a bare agent id/name)."""
    text: str
    via: Literal["tool", "workflow"]
    """``tool``: an agent tool or ``rune@agent-send`` (the network rule applies); ``workflow``: a step."""
    max_depth: int
    timeout_s: float | None = None
    """An upper bound of its own (a step's or tool's ``timeout_ms``); the parent's deadline always bounds it."""
    step: str | None = None


def agent_from_ref(agent_ref: str) -> str:
    """The agent a ``local://NAME`` reference names (remote URLs go to ``Daemon.remote``, never here)."""
    if agent_ref.startswith(("http://", "https://")):
        raise ChildRefused("remote_agent", f"{agent_ref}: a remote agent is not a local agent")
    if AGENT_REF.match(agent_ref) and agent_ref.startswith("local://"):
        return agent_ref.removeprefix("local://")
    return agent_ref


def build_child_intent(key: Ed25519PrivateKey, parent: ChainLink, agent_id: str, text: str) -> tuple[Intent, str]:
    """A fresh child intent of ``parent`` for ``agent_id`` and the daemon's signature over it."""
    if len(text) > MAX_TEXT_CHARS:
        raise ChildRefused("text_too_long", f"the input is longer than {MAX_TEXT_CHARS} characters")
    intent = Intent(
        id="child-" + secrets.token_hex(12),
        text=text,
        agent=agent_id,
        issuer=parent.issuer,
        issued_at=now_ms(),
        priority=parent.priority,  # type: ignore[arg-type]
        parent=parent.intent_id,
    )
    return intent, sign_child_intent(key, intent)
