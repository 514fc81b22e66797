"""Prometheus metrics for ``GET /metrics``.

:class:`Metrics` owns its own CollectorRegistry rather than the process-wide
default, so tests and an in-process restart get fresh counters and nothing
another library registers leaks into covenant's endpoint.
"""

from __future__ import annotations

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

__all__ = ["Metrics", "DURATION_BUCKETS", "BATCH_BUCKETS", "FSYNC_BUCKETS"]

# From a 5 ms no-op agent to the 5-minute end of sensible wall-clock budgets.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Group commit: 1 under light load up to the default batch_max of 512 and beyond.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# fdatasync measured near 0.15 ms on local SSDs; slow disks show up in the top buckets.
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


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
            "covenant_registry_rejected_files", "Manifest files rejected at the last (re)load.", registry=r
        )
        self.model_calls = Counter(
            "covenant_model_calls",
            "Model provider requests made by the gateway (one per attempt), by agent, provider and outcome.",
            ["agent", "provider", "outcome"],
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

    def observe_model_call(self, agent: str, provider: str, outcome: str, input_tokens: int, output_tokens: int) -> None:
        """Matches the model gateway's ``observe`` hook (covenant.models.CallObserver)."""
        self.model_calls.labels(agent=agent, provider=provider, outcome=outcome).inc()
        if input_tokens:
            self.model_tokens.labels(agent=agent, provider=provider, direction="input").inc(input_tokens)
        if output_tokens:
            self.model_tokens.labels(agent=agent, provider=provider, direction="output").inc(output_tokens)

    def set_registry(self, agents: int, rejected: int) -> None:
        self.registry_agents.set(agents)
        self.registry_rejected.set(rejected)

    def listener_closed(self, listener: str, reason: str) -> None:
        """A connection closed unserved (covenant.daemon.network_server.ListenerObserver)."""
        self.listener_closed_connections.labels(listener=listener, reason=reason).inc()

    def listener_open(self, listener: str, connections: int) -> None:
        self.listener_connections.labels(listener=listener).set(connections)

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its Content-Type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
