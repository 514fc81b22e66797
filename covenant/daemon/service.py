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

Beside it, one job each: which agents a dispatch can reach and reloads
(:mod:`.live_agents`), the events and answer a dispatch writes
(:mod:`.dispatch_events`), stopping intents in flight (:mod:`.cancels`),
intents that running intents make (:mod:`.child_intents`), who reads which
record (:mod:`.visibility`) and the status document (:mod:`.status_view`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.a2a.client import RemoteAgents
from covenant.audit.errors import AuditEventReplaced
from covenant.audit.events import FLEET_DELIVERY
from covenant.audit.recent import records_since
from covenant.audit.writer import AuditLog
from covenant.clock import iso_now, now_ms
from covenant.config import Config
from covenant.daemon.agents_state import LoadedAgents
from covenant.daemon.cancels import CancelRequests
from covenant.daemon.child_intents import ChildIntents, child_refusal
from covenant.daemon.config_reload import ConfigReload
from covenant.daemon.dispatch_events import (
    ChildOrigin,
    Event,
    completion_events,
    decision_event,
    outcome_document,
    received_event,
    refused_completion,
    rejection_event,
)
from covenant.daemon.front_doors import FrontDoors
from covenant.daemon.grants_watch import GrantsWatch, IdentityNames
from covenant.daemon.live_agents import LiveAgents
from covenant.daemon.metrics import Metrics
from covenant.daemon.remote_calls import RemoteCalls
from covenant.daemon.routing import route
from covenant.daemon.rune_dispatch import run_rune_intent
from covenant.daemon.rune_host import RuneHost
from covenant.daemon.scheduler import Overloaded, Scheduler, ShuttingDown, Withdrawn
from covenant.daemon.visibility import VisibleRecords
from covenant.daemon.workflow_gate import WorkflowGate, workflow_for
from covenant.daemon.workflow_record import workflow_record
from covenant.errors import CovenantError
from covenant.home import Home
from covenant.manifest.model import AgentSpec
from covenant.manifest.workflow import Workflow, WorkflowStep
from covenant.policy.budget import BudgetLedger
from covenant.policy.check import check_capabilities
from covenant.policy.errors import BadIntent
from covenant.policy.intents import Intent, IntentVerifier
from covenant.rune.sessions import valid_session_id
from covenant.runtime.isolation import Isolation
from covenant.runtime.outcome import DispatchRecord
from covenant.runtime.records import DispatchStore, encode_record
from covenant.runtime.runner import Runner
from covenant.stream_sink import StreamSink
from covenant.workflow import ChainLink, ChildCall, IntentChain
from covenant.workflow.engine import StepResult, run_workflow
from covenant.workflow.plan import workflow_plan

__all__ = ["Daemon"]

log = logging.getLogger("covenant.daemon")

_RECEIVED = frozenset({"intent.received"})
_REPLAY_SLACK_MS = 60_000
"""Read this much further back than two skew windows: audit timestamps and issued_at come from different clocks."""
_CHILDREN_SETTLE_S = 15.0
"""How long a Rune intent's record waits for the children it was calling to end (a kill ladder, a commit)."""


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
        self.budget = budget
        self.metrics = metrics
        self.socket_paths = socket_paths
        self.network_isolation = network_isolation
        self.rune = rune
        self.key = key
        """The daemon's key: it signs the child intents it makes (and the audit log's checkpoints)."""
        self.chain = IntentChain()
        self.front_doors: FrontDoors | None = None
        """The webhook and A2A listeners, schedules and fleet (set once they exist): status, and warnings at reload."""
        self.agents = LiveAgents(home=home, config=config, loaded=agents, rune=rune, audit=audit, metrics=metrics,
                                 isolation=runner.isolation, live_roots=runner.uids.live_roots)
        """The agents a dispatch can reach (``agents.loaded``), reloads, and the spawned agents."""
        self.records = VisibleRecords(store, config.isolation.operators_group)
        self.remote = RemoteCalls(RemoteAgents(config.a2a, os.environ), lambda: self.grants.current, audit.record)
        """Remote A2A agents (an ``http(s)://`` agent_ref, ``rune@a2a-*``), called only under ``[a2a] remotes``."""
        self.workflow_gate = WorkflowGate(
            route=lambda name, caller, issuer: self._route("", name, spawner=caller, issuer=issuer),
            decide=self._policy_decision, remote_refusal=self.remote.refusal,
            workflow_of=lambda agent, caller: workflow_for(agent, self.agents.loaded.workflows,
                                                           self.agents.loaded.packages, step_of=caller),
            max_depth=lambda: self.config.rune.max_depth, label=self._issuer_label,
        )
        """Every step of a workflow routed and decided before its first step runs."""
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
        self.cancels = CancelRequests(self.chain, self.scheduler, runner)
        self.children = ChildIntents(
            chain=self.chain, key=key, agents=self.agents, remote=self.remote, cancels=self.cancels,
            dispatch_verified=lambda intent, child, peer_uid: self._dispatch(
                intent, dry_run=False, session_id=None, sink=None, child=child, peer_uid=peer_uid),
        )
        """Intents that running intents make (agent tools, workflow steps, remote calls)."""
        self._reload_lock = trio.Lock()
        self.config_reload: ConfigReload
        """covenant.toml on reload; set by :func:`covenant.daemon.main.serve_daemon` once the components that take
        a reloaded config (schedules, webhook and A2A apps) exist, before anything is served."""

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
        daemon_signer: str | None = None, fleet_delivery: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Run one signed intent; returns the outcome document or raises CovenantError.

        ``body`` may hold ``session_id`` (Rune agents). With ``sink`` (the client asked for a
        stream) a Rune agent whose ``streaming_enabled`` is true streams its events into it.
        ``peer_uid`` (SO_PEERCRED of the submitting client) is kept in the dispatch record:
        that uid may read the record back. ``daemon_signer`` (the daemon's hex public key, never
        taken from a request) marks an intent the daemon signed on its issuer's behalf: a schedule or
        webhook firing (covenant.triggers); it is then decided by that issuer's grants like any other.
        ``fleet_delivery`` (the data of a ``fleet.delivery`` event, from ``covenant fleet``) is written
        in the same commit as the intent's first events, whatever becomes of it.
        """
        leading = [(FLEET_DELIVERY, fleet_delivery)] if fleet_delivery is not None else []
        if self.shutting_down:
            if leading:
                await self.audit.record_many(leading)
            self.metrics.policy_denied(ShuttingDown.code)
            raise ShuttingDown("the daemon is shutting down and accepts no new dispatches")
        with self._admission():
            self.audit.check_writable()  # fail closed before anything is verified, decided or spawned
            try:
                intent = self.verifier.verify(body, now_ms(), signer=daemon_signer)
            except CovenantError as exc:
                await self._audit_rejection(body, exc, leading)
                raise
            dry_run = bool(body.get("dry_run", False))
            session_id = body.get("session_id")
            if session_id is not None and (not isinstance(session_id, str) or not valid_session_id(session_id)):
                raise BadIntent(f"session_id {session_id!r}: use 1-128 of A-Za-z0-9._-", field="session_id")
            return await self._dispatch(
                intent, dry_run=dry_run, session_id=session_id, sink=sink, child=None, peer_uid=peer_uid,
                leading=leading,
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

    async def _dispatch(
        self, intent: Intent, *, dry_run: bool, session_id: str | None, sink: StreamSink | None, child: ChildOrigin | None,
        peer_uid: int | None, leading: list[Event] | None = None,
    ) -> dict[str, Any]:
        """A verified intent (signed by its issuer, or a child the daemon signed): route, decide, run.

        It is cancellable (:meth:`cancel`) from here to its answer. ``leading`` events (a fleet delivery)
        go first in the commit of its ``intent.received``.
        """
        with self.cancels.tracking(intent.id):
            return await self._route_decide_run(
                intent, dry_run=dry_run, session_id=session_id, sink=sink, child=child, peer_uid=peer_uid,
                leading=leading or [],
            )

    async def _route_decide_run(
        self, intent: Intent, *, dry_run: bool, session_id: str | None, sink: StreamSink | None, child: ChildOrigin | None,
        peer_uid: int | None, leading: list[Event],
    ) -> dict[str, Any]:
        received = received_event(intent, dry_run=dry_run, store_text=self.config.audit.store_text, child=child,
                                  peer_uid=peer_uid)
        try:
            spawner = child.parent.agent_id if child is not None else None
            agent, routed_by = self._route(intent.text, intent.agent, spawner=spawner, issuer=intent.issuer.pubkey)
        except CovenantError as exc:
            self.metrics.policy_denied(exc.code)
            unrouted = {"allowed": False, "decision": "deny", "reason": exc.code, "message": exc.message}
            await self.audit.record_many([*leading, received, decision_event(intent, None, unrouted)])
            self._log_dispatch("dispatch refused", intent, intent.agent, outcome=exc.code)
            raise
        if child is not None:
            refusal = child_refusal(child, agent, self.agents.loaded.packages)
            if refusal is not None:
                self.metrics.policy_denied(refusal.code)
                refused = {"allowed": False, "decision": "deny", "reason": refusal.code, "message": refusal.message,
                           "depth": child.parent.depth + 1}
                await self.audit.record_many([received, decision_event(intent, agent, refused)])
                self._log_dispatch("dispatch refused", intent, agent.id, outcome=refusal.code)
                raise refusal
        await self.refresh_grants()
        decision, denial = self._decide(intent, agent, routed_by)
        if child is not None:
            decision["depth"] = child.parent.depth + 1
        workflow = self._workflow_for(agent, child)
        plan: dict[str, Any] | None = None
        if workflow is not None and denial is None:
            plan, denial = self._check_workflow(intent, agent, workflow, child, decision)
            if denial is not None and dry_run:
                denial.details["workflow"] = plan  # the dry run shows every step, the allowed ones too
        pending = [*leading, received, decision_event(intent, agent, decision)]
        if denial is not None or dry_run:
            await self.audit.record_many(pending)
            if denial is not None:
                self._log_dispatch("dispatch refused", intent, agent.id, outcome=denial.code)
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
                answer["rune"] = await trio.to_thread.run_sync(self.rune.plan, agent, self.agents.loaded.packages[agent.id])
            if plan is not None:
                answer["workflow"] = plan
            return answer
        link = self._link(intent, agent, child, workflow, peer_uid)
        if workflow is not None:
            return await self._run_workflow(intent, agent, routed_by, decision, pending, link, workflow)
        if agent.runtime == "rune":
            return await self._run_rune(intent, agent, routed_by, decision, pending, session_id, sink, link)
        return await self._run(intent, agent, routed_by, decision, pending, link.peer_uid,
                               deadline=link.deadline if child is not None else None)

    def _route(self, text: str, requested: str | None, *, spawner: str | None, issuer: str) -> tuple[AgentSpec, str]:
        """The agent an intent goes to, and how it was chosen: the one route of every intent and workflow step.

        ``spawner``: the agent making the intent (a child's caller; None for a root), which alone reaches the
        agents it spawned for ``issuer``."""
        return route(
            text,
            self.agents.reachable(spawner, issuer),
            requested=requested,
            default_agent=self.config.default_agent,
            withdrawn=self.agents.loaded.withdrawn,
            stopped=self.agents.stopped,  # the one check: every front door (steps, triggers, A2A, fleet) comes here
        )

    def _workflow_for(self, agent: AgentSpec, child: ChildOrigin | None) -> Workflow | None:
        """The workflow an intent to ``agent`` runs (:func:`workflow_for`)."""
        step_of = child.parent.agent_id if child is not None and child.call.via == "workflow" else None
        return workflow_for(agent, self.agents.loaded.workflows, self.agents.loaded.packages, step_of=step_of)

    def _check_workflow(
        self, intent: Intent, agent: AgentSpec, workflow: Workflow, child: ChildOrigin | None, decision: dict[str, Any],
    ) -> tuple[dict[str, Any], CovenantError | None]:
        """Route and decide every step ``workflow`` can reach before any runs (:mod:`.workflow_gate`): the dry-run
        plan, and the refusal when a step may not run. ``decision`` (the workflow intent's) gets the steps, and
        is turned into a denial naming them."""
        depth = child.parent.depth + 1 if child is not None else 0
        verdicts = self.workflow_gate.check(workflow, agent, intent.issuer.pubkey, depth=depth)
        decision["steps"] = [v.to_json() for v in verdicts]
        refusal = self.workflow_gate.refusal(agent, verdicts, intent.issuer.pubkey)
        if refusal is not None:
            self.metrics.policy_denied(refusal.code)
            decision.update(allowed=False, decision="deny", reason=refusal.code, message=refusal.message,
                            hint=refusal.details["hint"])
        return workflow_plan(workflow, verdicts), refusal

    def _link(
        self, intent: Intent, agent: AgentSpec, child: ChildOrigin | None, workflow: Workflow | None, peer_uid: int | None
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
            return self.agents.loaded.packages[agent.id].runefile.timeout_ms
        return agent.resources.cpu_ms_per_task

    def _enter(self, intent: Intent, agent: AgentSpec) -> None:
        self.inflight[intent.id] = _Inflight(intent.id, agent.id, time.monotonic())

    def _leave(self, intent: Intent) -> None:
        del self.inflight[intent.id]

    def _log_dispatch(self, message: str, intent: Intent, agent_id: str | None, **fields: Any) -> None:
        """One log line per dispatch start, end or refusal: what `covenant logs` shows an operator.

        ``issuer`` is the key's identity: the name the home's identities give its public key, else the key
        itself, never the display name the intent claims (any key may claim any name)."""
        issuer = self.names.display_for(intent.issuer.pubkey) or intent.issuer.pubkey
        log.info(message, extra={"intent": intent.id, "agent": agent_id, "issuer": issuer, **fields})

    @contextmanager
    def _hosted_intent(self, intent: Intent, agent: AgentSpec, link: ChainLink) -> Iterator[trio.CancelScope]:
        """A Rune or workflow intent from the commit of its decision to its end: in the chain (its children
        may run), in flight, and cancellable (:meth:`cancel`, :meth:`cancel_all`) from the first moment."""
        link.run_scope = trio.CancelScope()
        self.chain.open(link)
        self._enter(intent, agent)
        if (reason := self.cancels.reason(intent.id)) is not None:  # cancelled while it was decided
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
        package = self.agents.loaded.packages[agent.id]
        if sink is not None and not package.runefile.runtime.streaming_enabled:
            sink = None
        waiting = self.rune.replicas.waiting(agent.id)
        if self.rune.replicas.full(agent.id) and waiting >= self.config.daemon.queue_max:
            await self.audit.record_many([*pending, refused_completion(intent, agent, "overloaded")])
            self.metrics.policy_denied(Overloaded.code)
            raise Overloaded(
                f"{waiting} intents already wait for the replica of {agent.id} (daemon.queue_max = "
                f"{self.config.daemon.queue_max}); try again later"
            )
        with self._hosted_intent(intent, agent, link):
            await self._record_gapless(intent, agent, list(pending))  # a cancel during this commit stops it before its replica
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
                "peer_uid": link.peer_uid, "parent": intent.parent, "children": self.chain.close(intent.id),
                "artifacts": await self.rune.tools.artifacts_of(intent.id)})
            await self._finish(intent, agent, record, pending)
        return outcome_document(intent, agent, routed_by, decision, record)

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
            await self._record_gapless(intent, agent, list(pending))  # a cancel during this commit stops it before its steps
            pending.clear()
            started_at, t0 = iso_now(), time.monotonic()
            result = None
            with scope:
                result = await run_workflow(workflow, intent.text, partial(self._run_step, intent), deadline=link.deadline)
            if result is not None:  # None: cancelled before the engine returned
                self.metrics.retried(agent.id, "workflow_step", sum(max(0, s.attempts - 1) for s in result.steps.values()))
            record = workflow_record(intent, agent, workflow, result, started_at, t0, link.cancel_reason).model_copy(
                update={"peer_uid": link.peer_uid, "parent": intent.parent, "children": self.chain.close(intent.id)})
            await self._finish(intent, agent, record, pending)
        return outcome_document(intent, agent, routed_by, decision, record)

    async def _run_step(self, parent: Intent, step: WorkflowStep, text: str) -> StepResult:
        """One attempt of one workflow step: a child intent of the workflow's intent."""
        call = ChildCall(
            parent_id=parent.id, agent_ref=step.agent_ref, text=text, via="workflow",
            max_depth=self.config.rune.max_depth,
            timeout_s=step.timeout_ms / 1000 if step.timeout_ms is not None else None, step=step.id,
        )
        try:
            document = await self.children.dispatch(call)
        except CovenantError as exc:
            return StepResult(exc.code, None, exc.message, None)
        return StepResult(document["outcome"], document.get("text"), document.get("error"), document["intent_id"])

    def cancel(self, intent_id: str, reason: str) -> bool:
        """Stop one in-flight intent at whatever stage it is (the verb of the A2A server's ``Dispatcher``);
        see :meth:`CancelRequests.cancel`."""
        return self.cancels.cancel(intent_id, reason)

    def _decide(self, intent: Intent, agent: AgentSpec, routed_by: str) -> tuple[dict[str, Any], CovenantError | None]:
        """The intent's policy decision (:meth:`_policy_decision`), a denial counted in the metrics."""
        decision, denial = self._policy_decision(intent.issuer.pubkey, agent, routed_by)
        if denial is not None:
            self.metrics.policy_denied(denial.code)
        return decision, denial

    def _policy_decision(self, issuer: str, agent: AgentSpec, routed_by: str) -> tuple[dict[str, Any], CovenantError | None]:
        """May the key ``issuer`` make ``agent`` run now: its grants, then the agent's budget (no I/O). The
        ``policy.decision`` data and, when denied, the error to answer with. Every intent and, before a workflow
        runs, each of its steps is decided here."""
        now = now_ms()
        decision = check_capabilities(issuer, agent, self.grants.current, now, issuer_display=self.names.display_for(issuer))
        audit = {"routed_by": routed_by, **decision.to_audit()}
        if not decision.allowed:
            try:
                decision.raise_if_denied()
            except CovenantError as exc:
                return {**audit, "reason": exc.code}, exc
        try:
            self.budget.check(agent, now)
        except CovenantError as exc:
            return {**audit, "allowed": False, "decision": "deny", "reason": exc.code}, exc
        return audit, None

    def _issuer_label(self, issuer: str) -> str:
        """The name this home knows the key ``issuer`` by, else the key: never the display an intent claims."""
        return self.names.display_for(issuer) or issuer

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
            await self._record_gapless(intent, agent, events)

        async def audit_spawn(spawned: dict[str, Any]) -> None:
            # The agent runs only after this returns; if it cannot be written, it never runs.
            await write_pending(("agent.spawned", {"intent": intent.id, "agent": agent.id, **spawned}))

        started = False
        t0 = time.monotonic()
        try:
            if not self.scheduler.can_start_now(agent.id):
                await write_pending()  # it will queue: the decision is durable before the wait
            if (reason := self.cancels.reason(intent.id)) is not None:
                raise Withdrawn(reason)  # cancelled while it was decided: it does not queue
            async with self.scheduler.slot(agent.id, intent.priority, child=intent.parent is not None, key=intent.id):
                if (reason := self.cancels.reason(intent.id)) is not None:
                    raise Withdrawn(reason)  # cancelled before it had a slot, or as its slot was granted
                self._update_queue_metrics()
                self._enter(intent, agent)
                self._log_dispatch("dispatch started", intent, agent.id)
                started = True
                try:
                    record = await self.runner.run(agent, payload, on_spawned=audit_spawn, deadline=deadline)
                    record = record.model_copy(update={"peer_uid": peer_uid, "parent": intent.parent})
                    await self._finish(intent, agent, record, pending)
                    self._log_dispatch("dispatch finished", intent, agent.id, outcome=record.outcome, ms=record.duration_ms)
                finally:
                    self._leave(intent)
        except Withdrawn as exc:
            record = self.runner.never_started(agent, intent.id, "cancelled", exc.message, t0=t0)
            await self._finish(intent, agent, record.model_copy(update={"peer_uid": peer_uid, "parent": intent.parent}),
                               pending)
            self._log_dispatch("dispatch finished", intent, agent.id, outcome="cancelled", ms=record.duration_ms)
        except AuditEventReplaced as exc:  # its completion is recorded already (_record_gapless)
            self._log_dispatch("dispatch failed", intent, agent.id, outcome=exc.code)
            raise
        except CovenantError as exc:
            if not started:  # refused before it ran: the queue was full (overloaded) or the daemon is stopping
                self.metrics.policy_denied(exc.code)
            await write_pending(refused_completion(intent, agent, exc.code))
            ended = "dispatch finished" if started else "dispatch refused"
            self._log_dispatch(ended, intent, agent.id, outcome=exc.code)
            raise
        finally:
            self._update_queue_metrics()
        return outcome_document(intent, agent, routed_by, decision, record)

    async def _finish(
        self, intent: Intent, agent: AgentSpec, record: DispatchRecord, pending: list[tuple[str, dict[str, Any]]]
    ) -> None:
        """Persist the record, charge the budget, audit the exit and the completion.

        ``pending`` still holds the intent's received and decision events when
        the agent could not be spawned (the spawn hook never ran).
        """
        self.budget.charge(agent.id, record.cpu_ms, now_ms())
        self.metrics.observe_dispatch(agent.id, record.outcome, record.duration_ms / 1000)
        events = [*pending, *completion_events(intent, agent, record, self.config.audit.store_text)]
        pending.clear()
        # The dispatch record and the audit events are made durable in one commit of the writer process.
        await self._record_gapless(intent, agent, events, dispatch_record=encode_record(record))

    async def _record_gapless(
        self, intent: Intent, agent: AgentSpec, events: list[tuple[str, dict[str, Any]]], *,
        dispatch_record: bytes | None = None,
    ) -> None:
        """``record_many`` for an allowed intent's events, never leaving its record with a gap.

        When an event could not be encoded, the log holds ``audit.error`` in its place; if that left the
        intent without an ``intent.completed`` (it was the one replaced, or the events were those before
        its agent ran, which now never runs), one is recorded with outcome ``audit_error``. Then
        :class:`AuditEventReplaced` propagates: the dispatch fails, its outcome recorded.
        """
        try:
            await self.audit.record_many(events, dispatch_record=dispatch_record)
        except AuditEventReplaced as exc:
            completed = any(type_ == "intent.completed" for type_, _ in events) and "intent.completed" not in exc.replaced
            if not completed:
                await self.audit.record(*refused_completion(intent, agent, exc.code))
            raise

    async def _audit_rejection(self, body: dict[str, Any], exc: CovenantError, leading: list[Event]) -> None:
        """A rejected intent is audited too, with what it claimed (nothing is trusted)."""
        self.metrics.policy_denied(exc.code)
        await self.audit.record_many([*leading, rejection_event(body, exc)])

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
        """Re-read covenant.toml (what can change live is applied, the rest named as needing a restart), then
        rescan manifests, against the new config, and grants; a manifest that became invalid runs its last
        valid package from its snapshot, or withdraws its agent when it has none."""
        async with self._reload_lock:
            config = await self.config_reload.reload(reason=reason)
            self.config = config.config
            changes = await self.agents.rescan()
            await self.refresh_grants(force=True)
            await self.agents.record_registry(reason=reason, changes=changes.to_json())
            log.info(
                "reloaded",
                extra={"reason": reason, "agents": len(self.agents.loaded.agents), "rejected": len(self.agents.loaded.problems)},
            )
            if self.front_doors is not None:
                self.front_doors.warn_unknown_names()
            return {
                "agents": sorted(self.agents.loaded.agents),
                "problems": [str(p) for p in self.agents.loaded.problems],
                "rejected": sorted({str(p.path) for p in self.agents.loaded.problems}),
                **changes.to_json(),
                "config": config.to_json(),
            }
