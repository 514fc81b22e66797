"""/metrics text: parses with prometheus-client's own parser, and moves with events."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from covenant import __version__
from covenant.daemon.metrics import Metrics


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_documented_family_is_exported() -> None:
    body, _ = Metrics().render()
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {
        "covenant_dispatches",
        "covenant_dispatch_duration_seconds",
        "covenant_policy_denials",
        "covenant_queue_depth",
        "covenant_in_flight",
        "covenant_audit_batch_records",
        "covenant_audit_fsync_seconds",
        "covenant_registry_agents",
        "covenant_registry_rejected_files",
        "covenant_model_calls",
        "covenant_model_tokens",
        "covenant_process_start_time_seconds",
        "covenant_build_info",
    } <= names


def test_counters_gauges_and_histograms_move() -> None:
    m = Metrics()
    m.observe_dispatch("summarize", "ok", 0.03)
    m.observe_dispatch("summarize", "ok", 0.2)
    m.observe_dispatch("summarize", "timeout", 5.0)
    m.observe_dispatch("search-rs", "ok", 0.004)
    m.policy_denied("capability_denied")
    m.policy_denied("capability_denied")
    m.policy_denied("bad_signature")
    m.set_queue(depth=7, in_flight=3)
    m.observe_audit_batch(1, 0.00015)
    m.observe_audit_batch(40, 0.002)
    m.set_registry(agents=4, rejected_files=1)
    s = samples(m)
    assert s[("covenant_dispatches_total", (("agent", "summarize"), ("outcome", "ok")))] == 2
    assert s[("covenant_dispatches_total", (("agent", "summarize"), ("outcome", "timeout")))] == 1
    assert s[("covenant_dispatches_total", (("agent", "search-rs"), ("outcome", "ok")))] == 1
    assert s[("covenant_dispatch_duration_seconds_count", (("agent", "summarize"),))] == 3
    assert abs(s[("covenant_dispatch_duration_seconds_sum", (("agent", "summarize"),))] - 5.23) < 1e-9
    assert s[("covenant_dispatch_duration_seconds_bucket", (("agent", "summarize"), ("le", "0.05")))] == 1
    assert s[("covenant_dispatch_duration_seconds_bucket", (("agent", "summarize"), ("le", "0.25")))] == 2
    assert s[("covenant_policy_denials_total", (("reason", "capability_denied"),))] == 2
    assert s[("covenant_policy_denials_total", (("reason", "bad_signature"),))] == 1
    assert s[("covenant_queue_depth", ())] == 7
    assert s[("covenant_in_flight", ())] == 3
    assert s[("covenant_audit_batch_records_count", ())] == 2
    assert s[("covenant_audit_batch_records_sum", ())] == 41
    assert s[("covenant_audit_fsync_seconds_bucket", (("le", "0.00025"),))] == 1
    assert s[("covenant_registry_agents", ())] == 4
    assert s[("covenant_registry_rejected_files", ())] == 1
    assert s[("covenant_build_info", (("version", __version__),))] == 1
    start = s[("covenant_process_start_time_seconds", ())]
    assert time.time() - 24 * 3600 < start <= time.time()

    m.set_queue(depth=0, in_flight=0)
    m.observe_dispatch("summarize", "ok", 0.01)
    s2 = samples(m)
    assert s2[("covenant_queue_depth", ())] == 0
    assert s2[("covenant_dispatches_total", (("agent", "summarize"), ("outcome", "ok")))] == 3


def test_each_instance_has_its_own_registry() -> None:
    a, b = Metrics(), Metrics()
    a.policy_denied("stale_intent")
    assert ("covenant_policy_denials_total", (("reason", "stale_intent"),)) not in samples(b)


def test_model_calls_and_tokens_per_agent_and_provider() -> None:
    m = Metrics()
    m.observe_model_call("triage@local", "openai", "error", 0, 0)
    m.observe_model_call("triage@local", "local", "ok", 120, 30)
    m.observe_model_call("triage@local", "local", "ok", 80, 5)
    s = samples(m)
    labels = (("agent", "triage@local"), ("outcome", "error"), ("provider", "openai"))
    assert s[("covenant_model_calls_total", labels)] == 1
    assert s[("covenant_model_calls_total", (("agent", "triage@local"), ("outcome", "ok"), ("provider", "local")))] == 2
    assert s[("covenant_model_tokens_total", (("agent", "triage@local"), ("direction", "input"), ("provider", "local")))] == 200
    assert s[("covenant_model_tokens_total", (("agent", "triage@local"), ("direction", "output"), ("provider", "local")))] == 35
    assert ("covenant_model_tokens_total", (("agent", "triage@local"), ("direction", "input"), ("provider", "openai"))) not in s
