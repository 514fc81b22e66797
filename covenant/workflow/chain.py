"""The daemon's own record of which running intent made which (never taken from a caller).

Every intent the daemon runs is linked here while it runs: a signed intent
from the control socket is a root (depth 0, whatever ``parent`` it claims);
a child intent gets its parent's depth + 1, its parent's root issuer, and a
deadline no later than its parent's. A replica names only its own intent id
(which the daemon gave it), so depth, issuer and time cannot be forged from
inside an agent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from covenant.policy.intents import Issuer

__all__ = ["ChainLink", "IntentChain"]


@dataclass
class ChainLink:
    """One running intent as the daemon sees it."""

    intent_id: str
    agent_id: str
    issuer: Issuer
    """The root issuer: the person (or key) who signed the first intent of the chain."""
    depth: int
    deadline: float
    """``trio.current_time()`` by which this intent must end; children never run past it."""
    priority: str
    peer_uid: int | None = None
    """The uid of the client that submitted the root intent: it may read every record of the chain."""
    run_scope: trio.CancelScope | None = None
    """Cancelling it stops the intent's run (outcome ``cancelled``), its record still written: use :meth:`cancel`."""
    cancel_reason: str | None = None
    """Why it was cancelled (its record's ``error``): the first reason given to :meth:`cancel`."""
    children: list[dict[str, Any]] = field(default_factory=list)
    """Summaries of the child intents it made (copied into its dispatch record): :meth:`child_started`."""
    _open_children: int = field(default=0, repr=False)
    _children_done: trio.Event | None = field(default=None, repr=False)

    def child_started(self, summary: dict[str, Any]) -> None:
        """A child intent begins: its summary joins :attr:`children`; call :meth:`child_ended` when it is final."""
        self.children.append(summary)
        self._open_children += 1

    def child_ended(self) -> None:
        self._open_children -= 1
        if not self._open_children and self._children_done is not None:
            self._children_done.set()

    async def children_settled(self) -> None:
        """Return once every child started so far has ended, its summary final (at once when none runs)."""
        if self._open_children:
            if self._children_done is None or self._children_done.is_set():
                self._children_done = trio.Event()
            await self._children_done.wait()

    def cancel(self, reason: str) -> None:
        """Stop the intent's run, now or as soon as its run scope exists, with ``reason`` as its error."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self.run_scope is not None:
            self.run_scope.cancel()

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - trio.current_time())


class IntentChain:
    """intent id -> :class:`ChainLink` for every intent running now."""

    def __init__(self) -> None:
        self._links: dict[str, ChainLink] = {}

    def get(self, intent_id: str) -> ChainLink | None:
        return self._links.get(intent_id)

    def open(self, link: ChainLink) -> ChainLink:
        self._links[link.intent_id] = link
        return link

    def close(self, intent_id: str) -> list[dict[str, Any]]:
        """Forget a finished intent; returns the children it made."""
        link = self._links.pop(intent_id, None)
        return link.children if link is not None else []

    def __len__(self) -> int:
        return len(self._links)
