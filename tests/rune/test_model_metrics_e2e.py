"""The daemon wires the model gateway's metrics hook: /metrics counts calls and tokens per agent and provider."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from covenant.client import DaemonClient
from tests.daemon.conftest import DaemonProcess
from tests.fakes import Reply
from tests.rune.conftest import add_rune_agent, configure, outcome_of


def _samples(daemon: DaemonProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with DaemonClient(daemon.socket) as client:
        response = client._send("GET", "/metrics")
        assert response.status == 200
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_fallback_shows_in_the_model_metrics(daemon: DaemonProcess, fake_model_factory) -> None:
    down, up = fake_model_factory(), fake_model_factory()
    configure(daemon, ("down", down), ("up", up))
    add_rune_agent(daemon, toolset=(), providers=("down", "up"))
    daemon.start()
    down.script(Reply.error(503))
    up.script(Reply(text="answered by the second provider", usage=(21, 8)))
    result = daemon.cli("dispatch", "hello", "--agent", "chat@local", "--json")
    assert result.returncode == 0, outcome_of(result)
    samples = _samples(daemon)
    agent = ("agent", "chat@local")
    assert samples[("covenant_model_calls_total", (agent, ("outcome", "http_error"), ("provider", "down")))] == 1
    assert samples[("covenant_model_calls_total", (agent, ("outcome", "ok"), ("provider", "up")))] == 1
    assert samples[("covenant_model_tokens_total", (agent, ("direction", "input"), ("provider", "up")))] == 21
    assert samples[("covenant_model_tokens_total", (agent, ("direction", "output"), ("provider", "up")))] == 8
    assert daemon.stop() == 0
