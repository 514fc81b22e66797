"""Prometheus metrics for ``GET /metrics``.

:class:`Metrics` owns its own CollectorRegistry rather than the process-wide
default, so tests and an in-process restart get fresh counters and nothing
another library registers leaks into covenant's endpoint.
"""

from __future__ import annotations

import re

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)

from covenant import __version__

__all__ = ["Metrics", "DURATION_BUCKETS", "BATCH_BUCKETS", "FSYNC_BUCKETS", "MODEL_FAILURES"]

# From a 5 ms no-op agent to the 5-minute end of sensible wall-clock budgets.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Group commit: 1 under light load up to the default batch_max of 512 and beyond.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# fdatasync measured near 0.15 ms on local SSDs; slow disks show up in the top buckets.
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

MODEL_FAILURES = ("rate_limited", "http_error", "timeout", "unreachable", "bad_answer", "impostor", "interrupted")
"""How a model provider request can fail (covenant.models.gateway sets one per failed attempt)."""
_OUTCOME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
"""A label value taken from an error code: anything else is counted as ``error`` (bounded cardinality)."""


class Metrics:
    """Every metric the daemon exports, and the calls that move them.

    Example::

        metrics = Metrics()
        metrics.observe_dispatch("summarize", "ok", 0.042)
        body, content_type = metrics.render()
    """

    def __init__(self, version: str = __version__) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.dispatches = Counter(
            "covenant_dispatches", "Dispatches finished, by agent and outcome.", ["agent", "outcome"], registry=r
        )
        self.dispatch_duration = Histogram(
            "covenant_dispatch_duration_seconds",
            "Wall-clock time of a dispatch from spawn to teardown.",
            ["agent"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.policy_denials = Counter(
            "covenant_policy_denials", "Intents denied before anything ran, by reason.", ["reason"], registry=r
        )
        self.queue_depth = Gauge("covenant_queue_depth", "Dispatches waiting for a free slot.", registry=r)
        self.in_flight = Gauge("covenant_in_flight", "Dispatches whose agent is running.", registry=r)
        self.audit_batch_records = Histogram(
            "covenant_audit_batch_records",
            "Records written per audit group commit (one fdatasync).",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.audit_fsync = Histogram(
            "covenant_audit_fsync_seconds", "Latency of the audit log's fdatasync.", buckets=FSYNC_BUCKETS, registry=r
        )
        self.registry_agents = Gauge("covenant_registry_agents", "Agents loaded and dispatchable.", registry=r)
        self.registry_rejected = Gauge(
            "covenant_registry_rejected_files",
            "Files rejected at the last (re)load: one per file however many problems it has.",
            registry=r,
        )
        self.model_calls = Counter(
            "covenant_model_calls",
            "Model provider requests made by the gateway (one per attempt), by agent, provider and outcome "
            "(ok, or how the attempt failed: " + ", ".join(MODEL_FAILURES) + ").",
            ["agent", "provider", "outcome"],
            registry=r,
        )
        self.tool_calls = Counter(
            "covenant_tool_calls",
            "Tool calls of Rune agents, by agent and outcome (ok, or the call's error code).",
            ["agent", "outcome"],
            registry=r,
        )
        self.retries = Counter(
            "covenant_retries",
            "Attempts made again after a failed one, by agent and kind: tool (a tool's retry_policy), model "
            "(another provider request for the same model call: a retry after 429 or a fallback), "
            "workflow_step (a step's retries).",
            ["agent", "kind"],
            registry=r,
        )
        self.replica_restarts = Counter(
            "covenant_replica_restarts",
            "Rune replicas started again, by agent and reason: exited (it ended or failed to start and was "
            "restarted after backoff), operator (covenant restart), reload (its package changed).",
            ["agent", "reason"],
            registry=r,
        )
        self.http_refused = Counter(
            "covenant_http_refused",
            "Requests a listener answered with an HTTP error, by listener (control, webhooks, a2a) and status code "
            "(e.g. 401 bad signature or token, 409 replay, 413 body too large, 429 rate limited, 503 overloaded).",
            ["listener", "code"],
            registry=r,
        )
        self.model_tokens = Counter(
            "covenant_model_tokens",
            "Tokens counted from provider usage, by agent, provider and direction (input/output).",
            ["agent", "provider", "direction"],
            registry=r,
        )
        self.listener_closed_connections = Counter(
            "covenant_listener_closed",
            "Connections a listener closed unserved, by listener (webhooks, a2a, control) and reason: "
            "connection_cap, source_cap, header_timeout, body_timeout, out_of_fds.",
            ["listener", "reason"],
            registry=r,
        )
        self.listener_connections = Gauge(
            "covenant_listener_connections", "Open connections of a network listener.", ["listener"], registry=r
        )
        self.build_info = Info("covenant_build", "The running covenant version.", registry=r)
        self.build_info.info({"version": version})
        # covenant_process_start_time_seconds, _cpu_seconds_total, _resident_memory_bytes, _open_fds ...
        ProcessCollector(namespace="covenant", registry=r)

    def observe_dispatch(self, agent: str, outcome: str, duration_s: float) -> None:
        """One finished dispatch: counts it by outcome and records its duration."""
        self.dispatches.labels(agent=agent, outcome=outcome).inc()
        self.dispatch_duration.labels(agent=agent).observe(duration_s)

    def policy_denied(self, reason: str) -> None:
        """One denied intent, e.g. reason ``capability_denied`` or ``bad_signature``."""
        self.policy_denials.labels(reason=reason).inc()

    def set_queue(self, depth: int, in_flight: int) -> None:
        self.queue_depth.set(depth)
        self.in_flight.set(in_flight)

    def observe_audit_batch(self, records: int, fsync_s: float) -> None:
        """Matches the audit writer's ``on_batch(records, fsync_seconds)`` hook."""
        self.audit_batch_records.observe(records)
        self.audit_fsync.observe(fsync_s)

    def observe_model_call(
        self, agent: str, provider: str, outcome: str, input_tokens: int, output_tokens: int, attempt: int = 1
    ) -> None:
        """Matches the model gateway's ``observe`` hook (covenant.models.CallObserver); an ``attempt`` past the
        first of one model call is a retry or a fallback."""
        self.model_calls.labels(agent=agent, provider=provider, outcome=outcome).inc()
        if attempt > 1:
            self.retries.labels(agent=agent, kind="model").inc()
        if input_tokens:
            self.model_tokens.labels(agent=agent, provider=provider, direction="input").inc(input_tokens)
        if output_tokens:
            self.model_tokens.labels(agent=agent, provider=provider, direction="output").inc(output_tokens)

    def observe_tool_call(self, agent: str, outcome: str, attempts: int) -> None:
        """Matches the tool host's ``observe`` hook: one finished call, ``outcome`` ``ok`` or its error code."""
        self.tool_calls.labels(agent=agent, outcome=outcome if _OUTCOME.match(outcome) else "error").inc()
        if attempts > 1:
            self.retries.labels(agent=agent, kind="tool").inc(attempts - 1)

    def retried(self, agent: str, kind: str, times: int = 1) -> None:
        """``times`` attempts made again (``kind`` ``model`` or ``workflow_step``)."""
        if times > 0:
            self.retries.labels(agent=agent, kind=kind).inc(times)

    def replica_restarted(self, agent: str, reason: str) -> None:
        """Matches the replica supervisor's ``on_restart`` hook."""
        self.replica_restarts.labels(agent=agent, reason=reason).inc()

    def http_refusal(self, listener: str, status: int) -> None:
        """One request of ``listener`` answered with ``status`` (400 or more)."""
        self.http_refused.labels(listener=listener, code=str(status)).inc()

    def set_registry(self, agents: int, rejected_files: int) -> None:
        self.registry_agents.set(agents)
        self.registry_rejected.set(rejected_files)

    def listener_closed(self, listener: str, reason: str) -> None:
        """A connection closed unserved (covenant.daemon.network_server.ListenerObserver)."""
        self.listener_closed_connections.labels(listener=listener, reason=reason).inc()

    def listener_open(self, listener: str, connections: int) -> None:
        self.listener_connections.labels(listener=listener).set(connections)

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its Content-Type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
