"""The daemon's decisions: one dispatch from signed intent to recorded outcome.

Order of a dispatch, each step audited before the next one acts:
verify the signed intent -> route -> capability check and budget (fail
closed) -> wait for a run slot -> spawn the agent's process, held at its
exec gate -> one group commit of ``intent.received``, ``policy.decision``
and ``agent.spawned`` -> release the agent and supervise it -> the outcome,
durable before the caller is answered. A denied or unroutable intent spawns
nothing; its received and decision events are committed before the answer.

A Rune agent's intent takes the same path up to the decision; then its
received and decision events are committed and the agent's replica answers
it instead of a spawned process (:mod:`covenant.daemon.rune_dispatch`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant import __version__
from covenant.cancellation import only_cancelled
from covenant.clock import iso_now, ms_from_iso, now_ms
from covenant.audit.events import text_digest
from covenant.audit.recent import records_since
from covenant.audit.writer import AuditLog
from covenant.config import Config
from covenant.daemon.agents_state import LoadedAgents, merge_reload
from covenant.daemon.grants_watch import GrantsWatch, IdentityNames
from covenant.daemon.metrics import Metrics
from covenant.daemon.routing import NoAgent, route
from covenant.daemon.rune_dispatch import run_rune_intent
from covenant.stream_sink import StreamSink
from covenant.daemon.rune_host import RuneHost
from covenant.daemon.scheduler import Overloaded, Scheduler, ShuttingDown, Withdrawn
from covenant.daemon.server import Peer
from covenant.daemon.visibility import sees_every_record
from covenant.errors import CovenantError
from covenant.home import Home
from covenant.manifest.limits import ManifestLimits
from covenant.manifest.model import AgentSpec
from covenant.manifest.registry import scan_agents
from covenant.tools.refuse import enforce_unavailable_policy
from covenant.policy.budget import BudgetLedger
from covenant.policy.check import check_capabilities
from covenant.policy.errors import BadIntent
from covenant.policy.intents import Intent, IntentVerifier
from covenant.runtime.isolation import Isolation
from covenant.runtime.outcome import DispatchRecord, outcome_exit_code
from covenant.runtime.records import DispatchStore, encode_record
from covenant.runtime.runner import Runner
from covenant.rune.sessions import valid_session_id
from covenant.manifest.workflow import Workflow, WorkflowStep
from covenant.policy.intents import verify_child_intent
from covenant.workflow import ChainLink, ChildCall, ChildRefused, IntentChain, agent_from_ref, build_child_intent
from covenant.workflow.engine import StepResult, run_workflow
from covenant.workflow.plan import workflow_plan
from covenant.daemon.workflow_record import workflow_record
from covenant.daemon.remote_calls import RemoteCalls
from covenant.daemon.spawned import SpawnRefused, Spawned, SpawnedAgents
from covenant.a2a.client import RemoteAgents

__all__ = ["Daemon"]

log = logging.getLogger("covenant.daemon")

_NO_UID = -1
"""Matches no record's peer_uid: what a client with unknown credentials may read."""
_RECEIVED = frozenset({"intent.received"})
_REPLAY_SLACK_MS = 60_000
"""Read this much further back than two skew windows: audit timestamps and issued_at come from different clocks."""
_SHUTTING_DOWN = "covenant stopped the intent: the daemon is shutting down"
_CALLER_ENDED = "covenant stopped the intent: the intent that called it ended"
_CHILDREN_SETTLE_S = 15.0
"""How long a Rune intent's record waits for the children it was calling to end (a kill ladder, a commit)."""


def _log_dispatch(message: str, intent: Intent, agent_id: str | None, **fields: Any) -> None:
    """One log line per dispatch start, end or refusal: what `covenant logs` shows an operator."""
    log.info(message, extra={"intent": intent.id, "agent": agent_id, "issuer": intent.issuer.display, **fields})


@dataclass(frozen=True)
class _Child:
    """What the daemon knows of a child intent it is dispatching: the parent's chain entry, the call, its signature."""

    parent: ChainLink
    call: ChildCall
    signature: str


@dataclass
class _Inflight:
    intent_id: str
    agent_id: str
    started: float


class Daemon:
    """Holds the loaded state and performs dispatches; the API and signals call in."""

    def __init__(
        self,
        *,
        home: Home,
        config: Config,
        runner: Runner,
        audit: AuditLog,
        store: DispatchStore,
        grants: GrantsWatch,
        names: IdentityNames,
        agents: LoadedAgents,
        budget: BudgetLedger,
        metrics: Metrics,
        socket_paths: list[str],
        network_isolation: bool,
        rune: RuneHost,
        key: Ed25519PrivateKey,
        isolation: Isolation | None = None,
    ) -> None:
        self.home = home
        self.config = config
        self.runner = runner
        self.audit = audit
        self.store = store
        """Reads dispatch records back (the audit writer process appends them, see ``_finish``)."""
        self.grants = grants
        self.names = names
        self.loaded = agents
        self.budget = budget
        self.metrics = metrics
        self.socket_paths = socket_paths
        self.network_isolation = network_isolation
        self.rune = rune
        self.key = key
        """The daemon's key: it signs the child intents it makes (and the audit log's checkpoints)."""
        self.chain = IntentChain()
        self.spawned = SpawnedAgents(home.state_dir / "spawned", ManifestLimits.from_config(config.runtime),
                                     ttl_s=config.rune.spawned_ttl_s, per_spawner=config.rune.spawned_max)
        self.remote = RemoteCalls(RemoteAgents(config.a2a, os.environ), lambda: self.grants.current, audit.record)
        """Remote A2A agents (an ``http(s)://`` agent_ref, ``rune@a2a-*``), called only under ``[a2a] remotes``."""
        rune.packages = agents.packages
        self.isolation = isolation or Isolation.same_uid()
        self.verifier = IntentVerifier(config.policy.skew_s, config.policy.replay_cache)
        self.scheduler = Scheduler(
            max_concurrent=config.daemon.max_concurrent,
            per_agent=config.daemon.per_agent_concurrent,
            queue_max=config.daemon.queue_max,
        )
        self.started_monotonic = time.monotonic()
        self.started_at_ms = now_ms()
        self.shutting_down = False
        self.inflight: dict[str, _Inflight] = {}
        """Intents whose agent (or replica call, or workflow) is running, for ``covenant status``."""
        self.admitted = 0
        """Dispatches past the shutting-down check and not yet answered: what a drain waits for. Counted
        from the check, not from the start of their agent, so one still writing its decision (an await)
        when the stop signal comes is waited for too, not cut off when the daemon's tasks end."""
        self.idle = trio.Event()
        """Set while no dispatch is admitted."""
        self.idle.set()
        self._cancel_requests: dict[str, str | None] = {}
        """Intent id -> None, or why it was cancelled, for every intent in flight (roots and children), from
        its verification to its answer. A cancel that comes before the intent has anything to stop (while
        it is decided, or still writing its decision) waits here; it is applied as soon as there is."""
        self._cancelling_all = False
        """Set by :meth:`cancel_all`: an intent that starts after it (a child of one still ending) is
        cancelled from its first moment."""
        self._reload_lock = trio.Lock()
        metrics.set_registry(len(agents.agents), len(agents.problems))

    async def restore_replay_window(self) -> int:
        """Reload the intent ids of the last skew window from the audit log; call before serving.

        Every intent the daemon acted on has its ``intent.received`` event
        (with ``intent`` and ``issued_at``) made durable before the agent
        starts and before the caller is answered, so the audit log is the
        durable replay store: a request captured before a restart is refused
        after it (``replayed_intent``), at no cost to the dispatch path.
        """
        now = now_ms()
        since = now - 2 * self.verifier.skew_ms - _REPLAY_SLACK_MS
        records = await trio.to_thread.run_sync(records_since, self.home.audit_dir, since, _RECEIVED)
        seen = [
            (data["intent"], data["issued_at"])
            for data in (r["data"] for r in records)
            if isinstance(data.get("intent"), str) and type(data.get("issued_at")) is int
        ]
        # Hashing each id takes ≈ 1.2 µs: 0.1 s for a full default cache, off the loop.
        kept = await trio.to_thread.run_sync(self.verifier.restore, seen, now)
        log.info("replay window restored from the audit log", extra={"intents": kept, "read": len(records)})
        return kept

    # -- dispatch -----------------------------------------------------------------

    async def dispatch(
        self, body: dict[str, Any], *, sink: StreamSink | None = None, peer_uid: int | None = None,
        daemon_signer: str | None = None,
    ) -> dict[str, Any]:
        """Run one signed intent; returns the outcome document or raises CovenantError.

        ``body`` may hold ``session_id`` (Rune agents). With ``sink`` (the client asked for a
        stream) a Rune agent whose ``streaming_enabled`` is true streams its events into it.
        ``peer_uid`` (SO_PEERCRED of the submitting client) is kept in the dispatch record:
        that uid may read the record back. ``daemon_signer`` (the daemon's hex public key, never
        taken from a request) marks an intent the daemon signed on its issuer's behalf: a schedule or
        webhook firing (covenant.triggers); it is then decided by that issuer's grants like any other.
        """
        if self.shutting_down:
            raise ShuttingDown("the daemon is shutting down and accepts no new dispatches")
        with self._admission():
            self.audit.check_writable()  # fail closed before anything is verified, decided or spawned
            try:
                intent = self.verifier.verify(body, now_ms(), signer=daemon_signer)
            except CovenantError as exc:
                await self._audit_rejection(body, exc)
                raise
            dry_run = bool(body.get("dry_run", False))
            session_id = body.get("session_id")
            if session_id is not None and (not isinstance(session_id, str) or not valid_session_id(session_id)):
                raise BadIntent(f"session_id {session_id!r}: use 1-128 of A-Za-z0-9._-", field="session_id")
            return await self._dispatch(
                intent, dry_run=dry_run, session_id=session_id, sink=sink, child=None, peer_uid=peer_uid
            )

    @contextmanager
    def _admission(self) -> Iterator[None]:
        """Count one dispatch as admitted (see :attr:`admitted`) for the duration of the block."""
        self.admitted += 1
        if self.admitted == 1:
            self.idle = trio.Event()
        try:
            yield
        finally:
            self.admitted -= 1
            if not self.admitted:
                self.idle.set()

    async def dispatch_child(self, call: ChildCall) -> dict[str, Any]:
        """Run a child intent of a running intent (an agent tool, ``rune@agent-send``, a workflow step).

        The daemon builds and signs it for the root issuer; the root issuer's grants decide it.
        Returns the outcome document, or raises CovenantError when it is refused (audited).
        """
        # Not refused while the daemon drains: a child is part of its running parent, which the drain waits for.
        parent = self.chain.get(call.parent_id)
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
                document = await self.remote.send(parent, call.agent_ref, call.text, via=call.via,
                                                  timeout_s=call.timeout_s)
                summary["outcome"] = document["outcome"]
                return document
            name = agent_from_ref(call.agent_ref)
            intent, signature = build_child_intent(self.key, parent, name, call.text)
            verify_child_intent(self.key.public_key(), intent, signature)
            summary["intent"] = intent.id
            found = self._find_agent(name)
            summary["agent"] = found.id if found is not None else None
            document = await self._run_child_to_its_end(intent, _Child(parent, call, signature), parent.peer_uid)
            summary.update(agent=document["agent"], outcome=document["outcome"])
            return document
        except CovenantError as exc:
            summary["outcome"] = exc.code
            raise
        except BaseException as exc:
            if only_cancelled(exc):  # out of the child's nursery it comes as a group: not `except trio.Cancelled`
                summary["outcome"] = "cancelled"
            raise
        finally:
            summary["duration_ms"] = int((time.monotonic() - t0) * 1000)
            parent.child_ended()

    async def _run_child_to_its_end(self, intent: Intent, child: _Child, peer_uid: int | None) -> dict[str, Any]:
        """Dispatch a child so that it always ends with its record and audit events.

        The caller may be cancelled (its own intent ended or ran out of time, a sibling workflow step
        failed); the child is then stopped as :meth:`cancel` stops any intent (outcome ``cancelled``:
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
                    self._cancel(intent.id, _CALLER_ENDED)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_when_the_caller_is_cancelled)
            with trio.CancelScope(shield=True):
                try:
                    answer["document"] = await self._dispatch(
                        intent, dry_run=False, session_id=None, sink=None, child=child, peer_uid=peer_uid
                    )
                except CovenantError as exc:
                    answer["error"] = exc
                finally:
                    nursery.cancel_scope.cancel()
        if "error" in answer:
            raise answer["error"]
        return answer["document"]

    async def _dispatch(
        self, intent: Intent, *, dry_run: bool, session_id: str | None, sink: StreamSink | None, child: _Child | None,
        peer_uid: int | None,
    ) -> dict[str, Any]:
        """A verified intent (signed by its issuer, or a child the daemon signed): route, decide, run.

        It is cancellable (:meth:`cancel`) from here to its answer.
        """
        self._cancel_requests[intent.id] = _SHUTTING_DOWN if self._cancelling_all else None
        try:
            return await self._route_decide_run(
                intent, dry_run=dry_run, session_id=session_id, sink=sink, child=child, peer_uid=peer_uid
            )
        finally:
            del self._cancel_requests[intent.id]

    async def _route_decide_run(
        self, intent: Intent, *, dry_run: bool, session_id: str | None, sink: StreamSink | None, child: _Child | None,
        peer_uid: int | None,
    ) -> dict[str, Any]:
        received = ("intent.received", self._intent_event(intent, dry_run, child, peer_uid))
        try:
            agent, routed_by = route(
                intent.text,
                self._reachable_agents(child, intent),
                requested=intent.agent,
                default_agent=self.config.default_agent,
                withdrawn=self.loaded.withdrawn,
            )
        except CovenantError as exc:
            self.metrics.policy_denied(exc.code)
            unrouted = {"allowed": False, "decision": "deny", "reason": exc.code, "message": exc.message}
            await self.audit.record_many([received, self._decision_event(intent, None, unrouted)])
            _log_dispatch("dispatch refused", intent, intent.agent, outcome=exc.code)
            raise
        if child is not None:
            refusal = self._child_refusal(child, agent)
            if refusal is not None:
                self.metrics.policy_denied(refusal.code)
                refused = {"allowed": False, "decision": "deny", "reason": refusal.code, "message": refusal.message,
                           "depth": child.parent.depth + 1}
                await self.audit.record_many([received, self._decision_event(intent, agent, refused)])
                _log_dispatch("dispatch refused", intent, agent.id, outcome=refusal.code)
                raise refusal
        await self.refresh_grants()
        decision, denial = self._decide(intent, agent, routed_by)
        if child is not None:
            decision["depth"] = child.parent.depth + 1
        pending = [received, self._decision_event(intent, agent, decision)]
        if denial is not None or dry_run:
            await self.audit.record_many(pending)
            if denial is not None:
                _log_dispatch("dispatch refused", intent, agent.id, outcome=denial.code)
                raise denial
            answer = {
                "dry_run": True,
                "intent_id": intent.id,
                "agent": agent.id,
                "routed_by": routed_by,
                "decision": decision,
                "message": f"would dispatch to {agent.id} (routed by {routed_by}); nothing was spawned",
            }
            if agent.runtime == "rune":
                # Resolving the toolset reads schema files: off the event loop.
                answer["rune"] = await trio.to_thread.run_sync(self.rune.plan, agent, self.loaded.packages[agent.id])
            workflow = self._workflow_for(agent, child)
            if workflow is not None:
                answer["workflow"] = workflow_plan(workflow, self._find_agent)
            return answer
        workflow = self._workflow_for(agent, child)
        link = self._link(intent, agent, child, workflow, peer_uid)
        if workflow is not None:
            return await self._run_workflow(intent, agent, routed_by, decision, pending, link, workflow)
        if agent.runtime == "rune":
            return await self._run_rune(intent, agent, routed_by, decision, pending, session_id, sink, link)
        return await self._run(intent, agent, routed_by, decision, pending, link.peer_uid,
                               deadline=link.deadline if child is not None else None)

    def _workflow_for(self, agent: AgentSpec, child: _Child | None) -> Workflow | None:
        """The workflow an intent to ``agent`` runs: a workflow folder's, or its Rune package's own.

        A step of a package's workflow that names the package's own agent runs that agent's
        model loop (not the workflow again).
        """
        if agent.runtime == "workflow":
            return self.loaded.workflows[agent.id]
        package = self.loaded.packages.get(agent.id)
        if package is None or package.workflow is None:
            return None
        if child is not None and child.call.via == "workflow" and child.parent.agent_id == agent.id:
            return None
        return package.workflow

    def _reachable_agents(self, child: _Child | None, intent: Intent) -> dict[str, AgentSpec]:
        """Every loaded agent; spawned ones only for a child intent of their spawner, for its issuer."""
        if not self.spawned.live:
            return self.loaded.agents
        spawner = child.parent.agent_id if child is not None else None
        return {agent_id: agent for agent_id, agent in self.loaded.agents.items()
                if agent_id not in self.spawned.live
                or (self.spawned.live[agent_id].spawner == spawner
                    and self.spawned.live[agent_id].issuer == intent.issuer.pubkey)}

    # -- spawned agents (rune@agent-spawn / agent-kill) -------------------------------------

    async def spawn_agent(self, parent: ChainLink, text: str) -> Spawned:
        """A new ``<name>@spawned`` agent for ``parent``'s agent and issuer (SpawnRefused when it may not be)."""
        spawner, package = self.loaded.agents.get(parent.agent_id), self.loaded.packages.get(parent.agent_id)
        if spawner is None or package is None or parent.agent_id in self.spawned.live:
            raise SpawnRefused("only a Rune agent loaded from agents/ may spawn agents")
        spawned = await self.spawned.create(text, spawner=spawner, spawner_package=package,
                                            issuer=parent.issuer.pubkey, issuer_display=parent.issuer.display,
                                            now_ms=now_ms())
        self._publish_spawned()
        await self.audit.record("agent.spawn", {"intent": parent.intent_id, **spawned.view(),
                                                "toolset": list(spawned.package.runefile.toolset)})
        log.info("agent spawned", extra={"agent": spawned.agent.id, "spawner": spawned.spawner})
        return spawned

    async def kill_spawned(self, parent: ChainLink, agent_id: str) -> Spawned:
        """Remove a spawned agent; only its spawner (same agent, same issuer) may."""
        spawned = self.spawned.live.get(agent_id) or self.spawned.live.get(f"{agent_id}@spawned")
        if spawned is None or spawned.spawner != parent.agent_id or spawned.issuer != parent.issuer.pubkey:
            raise SpawnRefused(f"{agent_id} is not an agent this agent spawned for this issuer")
        await self.remove_spawned(spawned.agent.id, reason="killed", intent=parent.intent_id)
        return spawned

    async def remove_spawned(self, agent_id: str, *, reason: str, intent: str | None = None) -> None:
        """Stop the spawned agent's replica (its runs end as cancelled), then forget it."""
        await self.rune.replicas.stop(agent_id, drain=False)
        spawned = await self.spawned.remove(agent_id)
        if spawned is None:
            return
        self._publish_spawned()
        await self.audit.record("agent.kill", {"intent": intent, **spawned.view(), "reason": reason})
        log.info("spawned agent removed", extra={"agent": agent_id, "reason": reason})

    async def expire_spawned(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Remove spawned agents past ``[rune] spawned_ttl_s``, checked every second, until cancelled."""
        task_status.started()
        while True:
            for agent_id in self.spawned.expired(now_ms()):
                await self.remove_spawned(agent_id, reason="expired")
            await trio.sleep(1)

    def _publish_spawned(self) -> None:
        """The loaded agents with the live spawned ones (after a spawn, a kill or a reload)."""
        agents = {k: v for k, v in self.loaded.agents.items() if not k.endswith("@spawned")}
        packages = {k: v for k, v in self.loaded.packages.items() if not k.endswith("@spawned")}
        for agent_id, spawned in self.spawned.live.items():
            agents[agent_id], packages[agent_id] = spawned.agent, spawned.package
        self.loaded = replace(self.loaded, agents=agents, packages=packages)
        self.rune.packages = self.loaded.packages
        self.rune.replicas.reconcile_soon({i: (agents[i], p) for i, p in packages.items()},
                                          eager=self.config.rune.start == "eager")

    def _find_agent(self, name: str) -> AgentSpec | None:
        try:
            return route("", self.loaded.agents, requested=name)[0]
        except CovenantError:
            return None

    def _child_refusal(self, child: _Child, agent: AgentSpec) -> ChildRefused | None:
        """Depth, then (agent tools only) the network rule; None when the child may go on to the grants."""
        depth = child.parent.depth + 1
        if depth > child.call.max_depth:
            return ChildRefused(
                "max_depth",
                f"calling {agent.id} would make a chain {depth} agent calls deep; the limit here is {child.call.max_depth} "
                "(the tool's max_depth, or [rune] max_depth)",
            )
        if child.call.via == "tool":
            caller = self.loaded.packages.get(child.parent.agent_id)
            callee = self.loaded.packages.get(agent.id)
            shared = set(caller.runefile.networks) & set(callee.runefile.networks) if caller and callee else set()
            if not shared:
                return ChildRefused(
                    "network",
                    f"{child.parent.agent_id} and {agent.id} share no network (Runefile networks), so the call is refused",
                )
        return None

    def _link(
        self, intent: Intent, agent: AgentSpec, child: _Child | None, workflow: Workflow | None, peer_uid: int | None
    ) -> ChainLink:
        """The chain entry of an intent about to run: depth, root issuer, and its deadline."""
        own_ms = workflow.timeout_ms if workflow is not None else self._own_timeout_ms(agent)
        deadline = trio.current_time() + own_ms / 1000
        depth = 0
        if child is not None:
            depth = child.parent.depth + 1
            deadline = min(deadline, child.parent.deadline)
            if child.call.timeout_s is not None:
                deadline = min(deadline, trio.current_time() + child.call.timeout_s)
        return ChainLink(intent.id, agent.id, intent.issuer, depth, deadline, intent.priority, peer_uid)

    def _own_timeout_ms(self, agent: AgentSpec) -> int:
        if agent.runtime == "rune":
            return self.loaded.packages[agent.id].runefile.timeout_ms
        return agent.resources.cpu_ms_per_task

    def _enter(self, intent: Intent, agent: AgentSpec) -> None:
        self.inflight[intent.id] = _Inflight(intent.id, agent.id, time.monotonic())

    def _leave(self, intent: Intent) -> None:
        del self.inflight[intent.id]

    @contextmanager
    def _hosted_intent(self, intent: Intent, agent: AgentSpec, link: ChainLink) -> Iterator[trio.CancelScope]:
        """A Rune or workflow intent from the commit of its decision to its end: in the chain (its children
        may run), in flight, and cancellable (:meth:`cancel`, :meth:`cancel_all`) from the first moment."""
        link.run_scope = trio.CancelScope()
        self.chain.open(link)
        self._enter(intent, agent)
        if (reason := self._cancel_requests[intent.id]) is not None:  # cancelled while it was decided
            link.cancel(reason)
        try:
            yield link.run_scope
        finally:
            self.chain.close(intent.id)
            self._leave(intent)

    async def _run_rune(
        self,
        intent: Intent,
        agent: AgentSpec,
        routed_by: str,
        decision: dict[str, Any],
        pending: list[tuple[str, dict[str, Any]]],
        session_id: str | None,
        sink: StreamSink | None,
        link: ChainLink,
    ) -> dict[str, Any]:
        """An allowed intent to a Rune agent: its decision is durable, then its replica answers."""
        package = self.loaded.packages[agent.id]
        if sink is not None and not package.runefile.runtime.streaming_enabled:
            sink = None
        waiting = self.rune.replicas.waiting(agent.id)
        if self.rune.replicas.full(agent.id) and waiting >= self.config.daemon.queue_max:
            await self.audit.record_many([*pending, ("intent.completed", {
                "intent": intent.id, "agent": agent.id, "outcome": "overloaded", "status": None})])
            raise Overloaded(
                f"{waiting} intents already wait for the replica of {agent.id} (daemon.queue_max = "
                f"{self.config.daemon.queue_max}); try again later"
            )
        with self._hosted_intent(intent, agent, link):
            await self.audit.record_many(list(pending))  # a cancel during this commit stops it before its replica
            pending.clear()
            try:
                record = await run_rune_intent(
                    self.rune.replicas, intent, agent, package, session_id=session_id,
                    secrets=self.rune.secret_values(), sink=sink, link=link,
                )
            finally:
                await self.rune.tools.intent_ended(intent.id)  # its rune@process-* processes die with it
            with trio.move_on_after(_CHILDREN_SETTLE_S):
                # Cancelled or out of time, it may end before the agents it called: theirs are being stopped.
                await link.children_settled()
            record = record.model_copy(update={
                "peer_uid": link.peer_uid, "parent": intent.parent, "children": self.chain.close(intent.id)})
            await self._finish(intent, agent, record, pending)
        return self._outcome_document(intent, agent, routed_by, decision, record)

    async def _run_workflow(
        self,
        intent: Intent,
        agent: AgentSpec,
        routed_by: str,
        decision: dict[str, Any],
        pending: list[tuple[str, dict[str, Any]]],
        link: ChainLink,
        workflow: Workflow,
    ) -> dict[str, Any]:
        """An allowed intent to a workflow agent: each step a child intent, run by the DAG engine."""
        with self._hosted_intent(intent, agent, link) as scope:
            await self.audit.record_many(list(pending))  # a cancel during this commit stops it before its steps
            pending.clear()
            started_at, t0 = iso_now(), time.monotonic()
            result = None
            with scope:
                result = await run_workflow(workflow, intent.text, partial(self._run_step, intent), deadline=link.deadline)
            record = workflow_record(intent, agent, workflow, result, started_at, t0, link.cancel_reason).model_copy(
                update={"peer_uid": link.peer_uid, "parent": intent.parent, "children": self.chain.close(intent.id)})
            await self._finish(intent, agent, record, pending)
        return self._outcome_document(intent, agent, routed_by, decision, record)

    async def _run_step(self, parent: Intent, step: WorkflowStep, text: str) -> StepResult:
        """One attempt of one workflow step: a child intent of the workflow's intent."""
        call = ChildCall(
            parent_id=parent.id, agent_ref=step.agent_ref, text=text, via="workflow",
            max_depth=self.config.rune.max_depth,
            timeout_s=step.timeout_ms / 1000 if step.timeout_ms is not None else None, step=step.id,
        )
        try:
            document = await self.dispatch_child(call)
        except CovenantError as exc:
            return StepResult(exc.code, None, exc.message, None)
        return StepResult(document["outcome"], document.get("text"), document.get("error"), document["intent_id"])

    async def restart_replica(self, agent_id: str) -> dict[str, Any]:
        """``covenant restart AGENT``: drain the agent's replica and start a fresh one."""
        agent = self.loaded.agents.get(agent_id) or self.loaded.agents.get(f"{agent_id}@local")
        if agent is None:
            raise NoAgent(f"no agent with id {agent_id!r} is loaded")
        if agent.runtime != "rune":
            raise NoAgent(f"agent {agent.id} is not a Rune agent: it has no replica to restart (runtime {agent.runtime})")
        log.info("replica restart requested", extra={"agent": agent.id})
        replica = await self.rune.replicas.restart(agent, self.loaded.packages[agent.id])
        return replica.view()

    def cancel(self, intent_id: str, reason: str) -> bool:
        """Stop one in-flight intent (outcome ``cancelled``, ``reason`` its record's error) at whatever stage
        it is, and the child intents it is waiting for; logged. False when it is not in flight."""
        found = self._cancel(intent_id, reason)
        log.info("intent cancel requested", extra={"intent": intent_id, "reason": reason, "in_flight": found})
        return found

    def _cancel(self, intent_id: str, reason: str) -> bool:
        if intent_id not in self._cancel_requests:
            return False
        if self._cancel_requests[intent_id] is None:  # the first reason stays
            self._cancel_requests[intent_id] = reason
        link = self.chain.get(intent_id)
        if link is not None:  # a Rune or workflow intent: its run scope
            link.cancel(reason)
            for child in link.children:  # its agent tools' and steps' intents still running end with it
                if child.get("intent") is not None and "outcome" not in child:
                    self._cancel(child["intent"], _CALLER_ENDED)
        self.scheduler.withdraw(intent_id, Withdrawn(reason))  # a process agent's intent waiting for a slot
        self.runner.cancel(intent_id, reason)  # ... or being spawned, or running
        return True

    def cancel_all(self) -> None:
        """Past the drain timeout: stop every intent in flight, and every one that starts from now on (the
        child of one still ending), at whatever stage (outcome ``cancelled``)."""
        self._cancelling_all = True
        self.runner.cancel_all()  # also the tool processes of Rune intents
        for intent_id in list(self._cancel_requests):
            self._cancel(intent_id, _SHUTTING_DOWN)

    def _decide(self, intent: Intent, agent: AgentSpec, routed_by: str) -> tuple[dict[str, Any], CovenantError | None]:
        """The capability and budget decision (no I/O) and, when denied, the error to answer with."""
        now = now_ms()
        decision = check_capabilities(
            intent.issuer.pubkey, agent, self.grants.current, now,
            issuer_display=self.names.display_for(intent.issuer.pubkey),
        )
        audit = {"routed_by": routed_by, **decision.to_audit()}
        if not decision.allowed:
            self.metrics.policy_denied("capability_denied")
            try:
                decision.raise_if_denied()
            except CovenantError as exc:
                return {**audit, "reason": exc.code}, exc
        try:
            self.budget.check(agent, now)
        except CovenantError as exc:
            self.metrics.policy_denied(exc.code)
            return {**audit, "allowed": False, "decision": "deny", "reason": exc.code}, exc
        return audit, None

    async def _run(
        self,
        intent: Intent,
        agent: AgentSpec,
        routed_by: str,
        decision: dict[str, Any],
        pending: list[tuple[str, dict[str, Any]]],
        peer_uid: int | None,
        *,
        deadline: float | None,
    ) -> dict[str, Any]:
        """Run an allowed intent. ``pending`` (its received and decision events) is written at the latest
        together with ``agent.spawned``, in one group commit, while the agent waits at its exec gate.
        ``deadline``: a child intent's (its caller's end, a step's ``timeout_ms``), see :meth:`_link`."""
        payload = {
            "id": intent.id,
            "text": intent.text,
            "issuer": {"display": intent.issuer.display, "pubkey": intent.issuer.pubkey},
            "issued_at": intent.issued_at,
            "priority": intent.priority,
            "parent": intent.parent,
        }

        async def write_pending(*more: tuple[str, dict[str, Any]]) -> None:
            events = [*pending, *more]
            pending.clear()
            await self.audit.record_many(events)

        async def audit_spawn(spawned: dict[str, Any]) -> None:
            # The agent runs only after this returns; if it cannot be written, it never runs.
            await write_pending(("agent.spawned", {"intent": intent.id, "agent": agent.id, **spawned}))

        started = False
        t0 = time.monotonic()
        try:
            if not self.scheduler.can_start_now(agent.id):
                await write_pending()  # it will queue: the decision is durable before the wait
            if (reason := self._cancel_requests[intent.id]) is not None:
                raise Withdrawn(reason)  # cancelled while it was decided: it does not queue
            async with self.scheduler.slot(agent.id, intent.priority, child=intent.parent is not None, key=intent.id):
                if (reason := self._cancel_requests[intent.id]) is not None:
                    raise Withdrawn(reason)  # cancelled before it had a slot, or as its slot was granted
                self._update_queue_metrics()
                self._enter(intent, agent)
                _log_dispatch("dispatch started", intent, agent.id)
                started = True
                try:
                    record = await self.runner.run(agent, payload, on_spawned=audit_spawn, deadline=deadline)
                    record = record.model_copy(update={"peer_uid": peer_uid, "parent": intent.parent})
                    await self._finish(intent, agent, record, pending)
                    _log_dispatch("dispatch finished", intent, agent.id, outcome=record.outcome, ms=record.duration_ms)
                finally:
                    self._leave(intent)
        except Withdrawn as exc:
            record = self.runner.never_started(agent, intent.id, "cancelled", exc.message, t0=t0)
            await self._finish(intent, agent, record.model_copy(update={"peer_uid": peer_uid, "parent": intent.parent}),
                               pending)
            _log_dispatch("dispatch finished", intent, agent.id, outcome="cancelled", ms=record.duration_ms)
        except CovenantError as exc:
            await write_pending(
                ("intent.completed", {"intent": intent.id, "agent": agent.id, "outcome": exc.code, "status": None})
            )
            ended = "dispatch finished" if started else "dispatch refused"
            _log_dispatch(ended, intent, agent.id, outcome=exc.code)
            raise
        finally:
            self._update_queue_metrics()
        return self._outcome_document(intent, agent, routed_by, decision, record)

    @staticmethod
    def _outcome_document(
        intent: Intent, agent: AgentSpec, routed_by: str, decision: dict[str, Any], record: DispatchRecord
    ) -> dict[str, Any]:
        result = record.result or {}
        document = {
            "intent_id": intent.id,
            "agent": agent.id,
            "routed_by": routed_by,
            "outcome": record.outcome,
            "exit_code": outcome_exit_code(record.outcome),
            "status": result.get("status"),
            "text": result.get("text"),
            "sources": result.get("sources", []),
            "error": record.error,
            "decision": decision,
            "record": record.model_dump(mode="json"),
        }
        if agent.runtime == "rune":
            document["session_id"] = record.session_id
            document["usage"] = record.usage
        return document

    async def _finish(
        self, intent: Intent, agent: AgentSpec, record: DispatchRecord, pending: list[tuple[str, dict[str, Any]]]
    ) -> None:
        """Persist the record, charge the budget, audit the exit and the completion.

        ``pending`` still holds the intent's received and decision events when
        the agent could not be spawned (the spawn hook never ran).
        """
        self.budget.charge(agent.id, record.cpu_ms, now_ms())
        self.metrics.observe_dispatch(agent.id, record.outcome, record.duration_ms / 1000)
        events: list[tuple[str, dict[str, Any]]] = [*pending]
        pending.clear()
        if record.runtime != "rune":  # a Rune intent spawns nothing: its replica answered it
            events.append(("agent.exited", {
                "intent": intent.id,
                "agent": agent.id,
                "pid": record.pid,
                "exit_code": record.exit_code,
                "signal": record.signal,
                "outcome": record.outcome,
                "duration_ms": record.duration_ms,
                "cpu_ms": record.cpu_ms,
                "peak_rss_kib": record.peak_rss_kib,
                "stdout_bytes": record.stdout_bytes,
                "left_behind": record.left_behind,
            }))
        result_text = (record.result or {}).get("text")
        completed = {
            "intent": intent.id,
            "agent": agent.id,
            "outcome": record.outcome,
            "status": (record.result or {}).get("status"),
            "result": text_digest(result_text, self.config.audit.store_text) if result_text is not None else None,
        }
        if record.runtime == "rune":
            completed.update(session=record.session_id, usage=record.usage, duration_ms=record.duration_ms)
        events.append(("intent.completed", completed))
        # The dispatch record and the audit events are made durable in one commit of the writer process.
        await self.audit.record_many(events, dispatch_record=encode_record(record))

    def _intent_event(
        self, intent: Intent, dry_run: bool, child: _Child | None = None, peer_uid: int | None = None
    ) -> dict[str, Any]:
        """``peer_uid`` is kept so that a record made from the log alone (an intent a killed daemon left
        unfinished, :mod:`covenant.daemon.interrupted`) is readable by the user who submitted it."""
        extra: dict[str, Any] = {}
        if child is not None:
            extra = {"signed_by": "daemon", "signature": child.signature, "depth": child.parent.depth + 1,
                     "via": child.call.via, **({"step": child.call.step} if child.call.step else {})}
        return {
            **extra,
            "intent": intent.id,
            "issuer": intent.issuer.pubkey,
            "issuer_display": intent.issuer.display,
            "agent_requested": intent.agent,
            "priority": intent.priority,
            "parent": intent.parent,
            "issued_at": intent.issued_at,
            "dry_run": dry_run,
            "text": text_digest(intent.text, self.config.audit.store_text),
            "peer_uid": peer_uid,
        }

    @staticmethod
    def _decision_event(intent: Intent, agent: AgentSpec | None, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("policy.decision", {"intent": intent.id, "agent": agent.id if agent else None, **data})

    async def _audit_rejection(self, body: dict[str, Any], exc: CovenantError) -> None:
        """A rejected intent is audited too, with what it claimed (nothing is trusted)."""
        self.metrics.policy_denied(exc.code)
        claimed = body.get("intent") if isinstance(body, dict) else None
        claimed = claimed if isinstance(claimed, dict) else {}
        issuer = claimed.get("issuer") if isinstance(claimed.get("issuer"), dict) else {}
        await self.audit.record(
            "policy.decision",
            {
                "intent": str(claimed.get("id"))[:200] if claimed.get("id") is not None else None,
                "agent": None,
                "allowed": False,
                "reason": exc.code,
                "message": exc.message,
                "claimed_issuer": str(issuer.get("pubkey"))[:200] if issuer.get("pubkey") is not None else None,
            },
        )

    def _update_queue_metrics(self) -> None:
        self.metrics.set_queue(self.scheduler.queued, self.scheduler.in_flight)

    # -- grants and reload -----------------------------------------------------------

    async def refresh_grants(self, *, force: bool = False) -> None:
        """Pick up grants.toml and identities.toml edits (`covenant grant`, `revoke`, `identity add`).

        A grant change is audited before the decision that depends on it.
        """
        if self.names.file.changed() or force:
            await trio.to_thread.run_sync(self.names.reload)
        if not (self.grants.file.changed() or force):
            return
        changes = await trio.to_thread.run_sync(self.grants.reload)
        if changes.error is not None:
            log.error("grants file unreadable; keeping the previous grants", extra={"problem": changes.error})
        for grant in changes.added:
            await self.audit.record("grant.added", grant)
        for grant in changes.revoked:
            await self.audit.record("grant.revoked", grant)

    async def reload(self, *, reason: str) -> dict[str, Any]:
        """Rescan manifests and grants; a manifest that became invalid withdraws its agent."""
        async with self._reload_lock:
            fresh = await trio.to_thread.run_sync(
                lambda: enforce_unavailable_policy(
                    scan_agents(self.home.agents_dir, ManifestLimits.from_config(self.config.runtime)), self.config
                )
            )
            without_spawned = replace(
                self.loaded, agents={k: v for k, v in self.loaded.agents.items() if not k.endswith("@spawned")},
                packages={k: v for k, v in self.loaded.packages.items() if not k.endswith("@spawned")})
            self.loaded, changes = merge_reload(without_spawned, fresh)
            self._publish_spawned()
            for agent_id in changes.withdrawn:
                log.warning(
                    "agent withdrawn: its manifest was rejected",
                    extra={"agent": agent_id, "path": str(self.loaded.withdrawn[agent_id])},
                )
            await self.refresh_grants(force=True)
            await self.record_registry(reason=reason, changes=changes.to_json())
            log.info(
                "reloaded",
                extra={"reason": reason, "agents": len(self.loaded.agents), "rejected": len(self.loaded.problems)},
            )
            return {
                "agents": sorted(self.loaded.agents),
                "problems": [str(p) for p in self.loaded.problems],
                "rejected": sorted({str(p.path) for p in self.loaded.problems}),
                **changes.to_json(),
            }

    async def record_registry(self, *, reason: str, changes: dict[str, Any] | None = None) -> None:
        """Audit the registry state and each rejected manifest; log the problems."""
        self.metrics.set_registry(len(self.loaded.agents), len(self.loaded.problems))
        rejected_by_file: dict[str, list[str]] = {}
        for problem in self.loaded.problems:
            rejected_by_file.setdefault(str(problem.path), []).append(str(problem))
            log.warning("manifest rejected", extra={"problem": str(problem)})
        for path, problems in sorted(rejected_by_file.items()):
            await self.audit.record("manifest.rejected", {"path": path, "problems": problems})
        await self.audit.record(
            "registry.loaded",
            {
                "reason": reason,
                "agents": sorted(self.loaded.agents),
                "rejected": len(rejected_by_file),
                **(changes or {}),
                "withdrawn": sorted(self.loaded.withdrawn),
            },
        )

    # -- views ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        head = self.audit.head or {}
        now = now_ms()
        return {
            "version": __version__,
            "pid": os.getpid(),
            "uptime_s": int(time.monotonic() - self.started_monotonic),
            "started_at_ms": self.started_at_ms,
            "home": str(self.home.root),
            "sockets": self.socket_paths,
            "shutting_down": self.shutting_down,
            "network_isolation": self.network_isolation,
            "isolation": self.isolation.mode,
            "isolation_detail": self.isolation.to_json(),
            "agents": {"loaded": sorted(self.loaded.agents), "withdrawn": sorted(self.loaded.withdrawn)},
            "rejected": [p.to_json() for p in self.loaded.problems],
            "in_flight": [
                {"intent": d.intent_id, "agent": d.agent_id, "elapsed_ms": int((time.monotonic() - d.started) * 1000)}
                for d in self.inflight.values()
            ],
            "queued": self.scheduler.queued,
            "admitted": self.admitted,
            "limits": {
                "max_concurrent": self.scheduler.max_concurrent,
                "per_agent": self.scheduler.per_agent,
                "queue_max": self.scheduler.queue_max,
            },
            "audit": {
                "healthy": self.audit.healthy,
                "failure": self.audit.failure,
                "head_seq": head.get("seq"),
                "writer_pid": next(iter(self.audit.process_ids), None),
                "checkpoint_age_ms": (now - ms_from_iso(head["ts"])) if "ts" in head else None,
                "head": head or None,
            },
            "grants": {
                "problems": [str(p) for p in self.grants.current.problems]
                + ([self.grants.load_error] if self.grants.load_error else []),
            },
            "replicas": self.rune.replicas.views(),
            "mcp_servers": self.rune.tools.mcp.status(),
        }

    def _reader_uid(self, viewer: Peer | None) -> int | None:
        """None when ``viewer`` may read every record, else the uid whose records it may read (blocking)."""
        if viewer is None:
            return _NO_UID  # credentials unknown: no record is theirs
        if sees_every_record(viewer, self.config.isolation.operators_group):
            return None
        return viewer.uid

    async def history(self, limit: int, agent: str | None, viewer: Peer | None) -> list[DispatchRecord]:
        """The newest records ``viewer`` may read (its own; all for root, the daemon's uid, operators)."""

        def read() -> list[DispatchRecord]:
            return self.store.recent(limit, agent, peer_uid=self._reader_uid(viewer))

        return await trio.to_thread.run_sync(read)

    async def record(self, intent_id: str, viewer: Peer | None) -> DispatchRecord | None:
        """The record of ``intent_id`` when ``viewer`` may read it; None otherwise (as if absent)."""

        def read() -> DispatchRecord | None:
            record = self.store.get(intent_id)
            only = self._reader_uid(viewer)
            return record if record is not None and (only is None or record.peer_uid == only) else None

        return await trio.to_thread.run_sync(read)
