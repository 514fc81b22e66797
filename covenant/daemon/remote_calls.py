"""Remote A2A calls made for a running intent: allowlist, grant, deadline, audit.

An ``http(s)://`` ``agent_ref`` (an agent tool, a workflow step) and
``rune@a2a-send``/``rune@a2a-discover`` all come here. In order: the URL must
be under ``[a2a] remotes`` (else a ``policy.decision`` with reason ``remote``);
a workflow step also needs the root issuer's grant of ``agent.remote`` (the
tools' own capabilities were checked by the tool host); then the call, bounded
by the calling intent's deadline and ``[a2a] call_timeout_ms``, audited as
``a2a.call``. The answer is an outcome document shaped like a child intent's.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from covenant.a2a.client import RemoteAgents, RemoteAnswer, RemoteFailed
from covenant.a2a.remotes import allowed
from covenant.clock import now_ms
from covenant.errors import CovenantError
from covenant.policy.check import grant_hint
from covenant.policy.errors import PolicyDenied
from covenant.policy.grants import GrantSet
from covenant.workflow import ChainLink, ChildRefused

__all__ = ["RemoteCalls", "REMOTE_ACTION"]

REMOTE_ACTION = "agent.remote"
"""The grant a workflow step with a remote ``agent_ref`` needs."""

_OUTCOMES = {"COMPLETED": "ok", "CANCELED": "cancelled", "REJECTED": "remote_rejected"}

Audit = Callable[[str, dict[str, Any]], Awaitable[Any]]


class RemoteCalls:
    def __init__(self, remotes: RemoteAgents, grants: Callable[[], GrantSet], audit: Audit) -> None:
        self.remotes = remotes
        self.grants = grants
        self.audit = audit

    def refusal(self, issuer: str, issuer_label: str, url: str, via: str) -> CovenantError | None:
        """Why the key ``issuer`` (named ``issuer_label`` in the message) may not call ``url`` ``via`` a tool or a
        workflow step: a URL outside remotes, or a step without ``agent.remote``; None when it may."""
        if not allowed(url, self.remotes.config.remotes):
            return ChildRefused("remote", f"{url} is not under [a2a] remotes in covenant.toml; "
                                          "an operator must list it there before agents may call it")
        if via == "workflow" and not self.grants().covering(issuer, REMOTE_ACTION, now_ms()):
            return PolicyDenied(f"issuer {issuer_label} may not call remote agents: missing {REMOTE_ACTION} "
                                f"(an operator can allow it with: {grant_hint(issuer_label, [REMOTE_ACTION])})")
        return None

    async def _check(self, parent: ChainLink, url: str, *, via: str) -> None:
        """Refuse (audited as ``policy.decision``) a URL outside remotes or a step without ``agent.remote``."""
        refusal = self.refusal(parent.issuer.pubkey, parent.issuer.display, url, via)
        if refusal is not None:
            await self.audit("policy.decision", {
                "intent": parent.intent_id, "agent": parent.agent_id, "url": url, "via": via, "allowed": False,
                "decision": "deny", "reason": "remote" if refusal.code == "remote" else refusal.code,
                "message": refusal.message})
            raise refusal

    async def send(self, parent: ChainLink, url: str, text: str, *, via: str, context_id: str | None = None,
                   timeout_s: float | None = None) -> dict[str, Any]:
        """One message to a remote agent for ``parent``: an outcome document (``outcome`` ok or why not)."""
        await self._check(parent, url, via=via)
        t0 = time.monotonic()
        answer: RemoteAnswer | None = None
        outcome, error = "ok", None
        with trio.move_on_at(self._deadline(parent, timeout_s)) as scope:
            try:
                answer = await self.remotes.send(url, text, context_id=context_id)
            except RemoteFailed as exc:
                outcome, error = exc.code, exc.message
        if scope.cancelled_caught:
            outcome, error = "timeout", f"{url} did not answer before the calling intent's deadline"
        if answer is not None:
            outcome = _OUTCOMES.get(answer.state, "remote_failed")
            if outcome != "ok":
                error = f"the remote task ended {answer.state}: {answer.text[:500]}"
        await self.audit("a2a.call", {
            "intent": parent.intent_id, "agent": parent.agent_id, "url": url, "via": via,
            "endpoint": answer.endpoint.url if answer else None,
            "version": answer.endpoint.version if answer else None,
            "task": answer.task_id if answer else None, "state": answer.state if answer else None,
            "outcome": outcome, "ms": int((time.monotonic() - t0) * 1000)})
        return {"intent_id": None, "agent": url, "outcome": outcome, "error": error,
                "text": answer.text if answer is not None and outcome == "ok" else None,
                "remote": {"task_id": answer.task_id if answer else None, "state": answer.state if answer else None,
                           "context_id": answer.context_id if answer else None}}

    async def discover(self, parent: ChainLink, url: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """The remote agent's card, summarised; RemoteFailed (or a refusal) when there is none to read."""
        await self._check(parent, url, via="tool")
        t0 = time.monotonic()
        outcome, card = "ok", None
        try:
            with trio.move_on_at(self._deadline(parent, timeout_s)) as scope:
                card = await self.remotes.card(url)
            if scope.cancelled_caught:
                raise RemoteFailed("timeout", f"{url} did not answer before the calling intent's deadline")
            if card is None:
                raise RemoteFailed("remote_error", f"{url} serves no agent card at /.well-known/agent-card.json")
            endpoint = self.remotes.endpoint(url, card)
        except RemoteFailed as exc:
            outcome = exc.code
            raise
        finally:
            await self.audit("a2a.call", {"intent": parent.intent_id, "agent": parent.agent_id, "url": url,
                                          "via": "discover", "endpoint": None, "version": None, "task": None,
                                          "state": None, "outcome": outcome, "ms": int((time.monotonic() - t0) * 1000)})
        skills = [{"id": s.get("id"), "name": s.get("name"), "description": s.get("description")}
                  for s in card.get("skills") or [] if isinstance(s, dict)]
        return {"name": card.get("name"), "description": card.get("description"), "version": card.get("version"),
                "skills": skills, "interface": {"url": endpoint.url, "binding": endpoint.binding,
                                                "version": endpoint.version},
                "streaming": bool((card.get("capabilities") or {}).get("streaming"))}

    def _deadline(self, parent: ChainLink, timeout_s: float | None) -> float:
        deadline = min(parent.deadline, trio.current_time() + self.remotes.config.call_timeout_ms / 1000)
        return min(deadline, trio.current_time() + timeout_s) if timeout_s is not None else deadline
