"""Intents that running intents make: an agent tool, ``rune@agent-send``, a workflow step, a remote A2A call.

The daemon builds and signs each child for its root issuer; the root issuer's grants decide it, on the
same path as any intent (:class:`covenant.daemon.service.Daemon`). Here: the chain bookkeeping around
it, the refusals particular to children (depth, shared network), and the rule that a child always ends
with its record even when its caller is cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.cancellation import only_cancelled
from covenant.clock import iso_now
from covenant.daemon.cancels import CALLER_ENDED, CancelRequests
from covenant.daemon.dispatch_events import ChildOrigin
from covenant.daemon.live_agents import LiveAgents
from covenant.daemon.remote_calls import RemoteCalls
from covenant.errors import CovenantError
from covenant.manifest.model import AgentSpec
from covenant.policy.intents import Intent, verify_child_intent
from covenant.workflow import (
    ChildCall,
    ChildRefused,
    IntentChain,
    agent_from_ref,
    build_child_intent,
)

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage

__all__ = ["ChildIntents", "child_refusal", "depth_refusal"]

DispatchVerified = Callable[[Intent, ChildOrigin, "int | None"], Awaitable[dict[str, Any]]]
"""The daemon's route-decide-run of a verified child intent (with the submitting client's uid)."""


class ChildIntents:
    """Runs the child intents of running intents (see the module)."""

    def __init__(self, *, chain: IntentChain, key: Ed25519PrivateKey, agents: LiveAgents, remote: RemoteCalls,
                 cancels: CancelRequests, dispatch_verified: DispatchVerified) -> None:
        self._chain = chain
        self._key = key
        self._agents = agents
        self._remote = remote
        self._cancels = cancels
        self._dispatch_verified = dispatch_verified

    async def dispatch(self, call: ChildCall) -> dict[str, Any]:
        """Run a child intent of a running intent (an agent tool, ``rune@agent-send``, a workflow step).

        The daemon builds and signs it for the root issuer; the root issuer's grants decide it.
        Returns the outcome document, or raises CovenantError when it is refused (audited).
        """
        # Not refused while the daemon drains: a child is part of its running parent, which the drain waits for.
        parent = self._chain.get(call.parent_id)
        if parent is None:
            raise ChildRefused("no_parent", f"intent {call.parent_id} is not running; only a running intent makes child intents")
        t0 = time.monotonic()
        summary: dict[str, Any] = {"intent": None, "agent": None, "via": call.via, "started_at": iso_now()}
        if call.step is not None:
            summary["step"] = call.step
        parent.child_started(summary)
        try:
            if call.agent_ref.startswith(("http://", "https://")):
                summary["agent"] = call.agent_ref
                document = await self._remote.send(parent, call.agent_ref, call.text, via=call.via,
                                                  timeout_s=call.timeout_s)
                summary["outcome"] = document["outcome"]
                return document
            name = agent_from_ref(call.agent_ref)
            intent, signature = build_child_intent(self._key, parent, name, call.text)
            verify_child_intent(self._key.public_key(), intent, signature)
            summary["intent"] = intent.id
            found = self._agents.find(name)
            summary["agent"] = found.id if found is not None else None
            return await self._run_to_its_end(intent, ChildOrigin(parent, call, signature), parent.peer_uid, summary)
        except CovenantError as exc:
            summary["outcome"] = exc.code
            raise
        except BaseException as exc:
            # Out of the child's nursery it comes as a group: not `except trio.Cancelled`. A child that ended
            # (its record written) before its caller's cancellation came through keeps its own outcome.
            if only_cancelled(exc) and "outcome" not in summary:
                summary["outcome"] = "cancelled"
            raise
        finally:
            summary["duration_ms"] = int((time.monotonic() - t0) * 1000)
            parent.child_ended()

    async def _run_to_its_end(self, intent: Intent, child: ChildOrigin, peer_uid: int | None,
                              summary: dict[str, Any]) -> dict[str, Any]:
        """Dispatch a child so that it always ends with its record and audit events, and ``summary`` (its entry
        in the caller's ``children``) with the record's agent and outcome, even when the caller's
        cancellation comes through as it returns.

        The caller may be cancelled (its own intent ended or ran out of time, a sibling workflow step
        failed); the child is then stopped as :meth:`CancelRequests.cancel` stops any intent (outcome ``cancelled``:
        a process agent's run through the kill ladder, a hosted intent through its run scope) and
        finishes its bookkeeping shielded, instead of vanishing half-recorded or running on to its own
        time limit while its caller waits.
        """
        answer: dict[str, Any] = {}

        async def stop_when_the_caller_is_cancelled() -> None:
            try:
                await trio.sleep_forever()
            finally:
                if not answer:
                    self._cancels.cancel_quietly(intent.id, CALLER_ENDED)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_when_the_caller_is_cancelled)
            with trio.CancelScope(shield=True):
                try:
                    answer["document"] = document = await self._dispatch_verified(intent, child, peer_uid)
                    summary.update(agent=document["agent"], outcome=document["outcome"])
                except CovenantError as exc:
                    answer["error"] = exc
                finally:
                    nursery.cancel_scope.cancel()
        if "error" in answer:
            raise answer["error"]
        return answer["document"]


def depth_refusal(agent_id: str, depth: int, max_depth: int) -> ChildRefused | None:
    """The refusal of a child intent to ``agent_id`` at chain ``depth`` past ``max_depth``, or None."""
    if depth <= max_depth:
        return None
    return ChildRefused(
        "max_depth",
        f"calling {agent_id} would make a chain {depth} agent calls deep; the limit here is {max_depth} "
        "(the tool's max_depth, or [rune] max_depth)",
    )


def child_refusal(child: ChildOrigin, agent: AgentSpec, packages: Mapping[str, RunePackage]) -> ChildRefused | None:
    """Depth, then (agent tools only) the network rule; None when the child may go on to the grants."""
    too_deep = depth_refusal(agent.id, child.parent.depth + 1, child.call.max_depth)
    if too_deep is not None:
        return too_deep
    if child.call.via == "tool":
        caller = packages.get(child.parent.agent_id)
        callee = packages.get(agent.id)
        shared = set(caller.runefile.networks) & set(callee.runefile.networks) if caller and callee else set()
        if not shared:
            return ChildRefused(
                "network",
                f"{child.parent.agent_id} and {agent.id} share no network (Runefile networks), so the call is refused",
            )
    return None
