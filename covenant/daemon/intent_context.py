"""What the daemon knows of one intent in flight on a Rune replica.

Its own module because the replica's gateway, the session keeper and the dispatch path all hold it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from covenant.manifest.model import AgentSpec

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage

__all__ = ["IntentContext"]


@dataclass
class IntentContext:
    """What the daemon knows of one intent in flight on a replica."""

    intent_id: str
    issuer_pubkey: str
    agent: AgentSpec
    package: RunePackage
    deadline: float
    """``trio.current_time()`` by which the intent must end."""
    session_id: str = ""
    """The session the daemon gave the intent: it loads that one for the invoke, and the replica may append
    to no other for it."""
    session_named: bool = False
    """The dispatch's caller named ``session_id`` (else the daemon made it up for this intent alone)."""
    state: dict[str, Any] = field(default_factory=dict)
    """Per-intent objects of the model and tool layers (the token budget)."""
    text: str = ""
    """The intent's text (a test-driven agent's task: the daemon reads it itself, :mod:`covenant.daemon.test_attempts`)."""
    asked_user: bool = False
    priority: str = "normal"
    """The intent's priority: the nice of its tools' processes moves by it (:mod:`covenant.runtime.cpu_class`)."""
    """The intent called ``rune@ask-user``: only then may its replica end it ``input_required``."""
