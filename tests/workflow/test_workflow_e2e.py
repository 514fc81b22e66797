"""Workflows end to end: a real daemon, real replicas, the scripted fake model provider."""

from __future__ import annotations

import json
import signal
import textwrap
import time

from tests.daemon.conftest import DaemonProcess
from tests.daemon.test_daemon_e2e import agent_processes
from tests.fakes import FakeModelServer, Reply
from tests.rune.conftest import outcome_of
from tests.workflow.conftest import audit, configure, copy_multi_agent, record, rune_agent

WORKFLOW = "research-and-analyse@local"


def test_the_corpus_multi_agent_workflow_runs_researcher_then_analyst(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("anthropic", fake_model))
    copy_multi_agent(daemon)
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)

    plan = outcome_of(daemon.cli("dispatch", "tidal power", "--agent", WORKFLOW, "--dry-run", "--json"))
    waves = plan["workflow"]["waves"]
    assert [[s["step"] for s in wave] for wave in waves] == [["researcher"], ["analyst"]]
    assert waves[0][0]["agent"] == "researcher@local" and "tool.web_fetch" in waves[0][0]["capabilities"]
    human = daemon.cli("dispatch", "tidal power", "--agent", WORKFLOW, "--dry-run", check=True).stdout
    assert "wave 0:" in human and "researcher: local://researcher -> researcher@local; needs" in human
    assert "analyst: local://analyst -> analyst@local, after researcher; needs" in human and "every step may run" in human
    assert not fake_model.requests  # a dry run calls no model

    fake_model.script(Reply(text="FINDINGS: tides move 2 TW."), Reply(text="SUMMARY: tides are steady."))
    result = daemon.cli("dispatch", "tidal power", "--agent", WORKFLOW, "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["outcome"] == "ok", outcome
    assert outcome["text"] == "SUMMARY: tides are steady."  # output_step: the analyst's answer
    researcher_request, analyst_request = fake_model.requests
    assert researcher_request.messages[-1]["content"] == "Research the following and return raw findings: tidal power"
    assert "FINDINGS: tides move 2 TW." in analyst_request.messages[-1]["content"]  # the analyst's input holds it

    root = record(daemon, outcome["intent_id"])
    assert root["parent"] is None and root["runtime"] == "workflow"
    assert [(c["step"], c["agent"], c["outcome"]) for c in root["children"]] == [
        ("researcher", "researcher@local", "ok"), ("analyst", "analyst@local", "ok")]
    for child in root["children"]:
        assert record(daemon, child["intent"])["parent"] == outcome["intent_id"]
    received = [r["data"] for r in audit(daemon, "intent.received") if r["data"].get("parent") == outcome["intent_id"]]
    assert len(received) == 2 and all(r["signed_by"] == "daemon" and r["depth"] == 1 for r in received)
    assert all(r["issuer"] == received[0]["issuer"] for r in received)  # the root issuer, not the daemon
    history = json.loads(daemon.cli("history", "--json", check=True).stdout)
    assert {h["intent_id"]: h["parent"] for h in history if h.get("parent")} == {
        c["intent"]: outcome["intent_id"] for c in root["children"]}
    tree = daemon.cli("show", outcome["intent_id"], check=True).stdout
    assert "researcher@local" in tree and "analyst@local" in tree and "step researcher" in tree
    assert daemon.stop() == 0


def _workflow(d: DaemonProcess, folder: str, text: str) -> None:
    root = d.home / "agents" / folder
    root.mkdir(parents=True, exist_ok=True)
    (root / "workflow.yaml").write_text(textwrap.dedent(text))


def _iso_ms(value: str) -> int:
    from covenant.clock import ms_from_iso

    return ms_from_iso(value)


def test_a_parallel_wave_overlaps_and_a_process_agent_can_be_a_step(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    _workflow(daemon, "fanout", """\
        name: fanout
        version: 0.1.0
        timeout_ms: 60000
        output_step: join
        steps:
          - id: left
            agent_ref: local://worker-a
            input_template: "left of {{ input }}"
          - id: right
            agent_ref: local://worker-b
            input_template: "right of {{ input }}"
          - id: join
            agent_ref: local://echo
            input_template: "{{ steps.left.output }} | {{ steps.right.output }}"
            depends_on: [left, right]
        """)
    for name in ("worker-a", "worker-b"):
        rune_agent(daemon, name, folder=daemon.home / "agents" / "fanout")
    daemon.add_agent("echo", "echo.py")
    daemon.start()
    # Each model answer takes 2 s: in parallel the two overlap; in series they could not.
    fake_model.script(Reply(text="ONE", delay_s=2), Reply(text="TWO", delay_s=2))
    plan = outcome_of(daemon.cli("dispatch", "x", "--agent", "fanout@local", "--dry-run", "--json"))
    assert [[s["step"] for s in w] for w in plan["workflow"]["waves"]] == [["left", "right"], ["join"]]
    assert plan["workflow"]["waves"][1][0]["agent"] == "echo@local"
    outcome = outcome_of(daemon.cli("dispatch", "the sea", "--agent", "fanout@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    assert outcome["text"] in ("ONE | TWO", "TWO | ONE")  # the echo step's answer is its rendered input
    assert sorted(r.messages[-1]["content"] for r in fake_model.requests) == ["left of the sea", "right of the sea"]
    children = {c["step"]: c for c in record(daemon, outcome["intent_id"])["children"]}
    spans = {}
    for step in ("left", "right", "join"):
        child = record(daemon, children[step]["intent"])
        spans[step] = (_iso_ms(child["started_at"]), _iso_ms(child["ended_at"]))
    (l0, l1), (r0, r1), (j0, _) = spans["left"], spans["right"], spans["join"]
    assert l0 < r1 and r0 < l1, spans  # the two steps of the first wave overlapped
    assert j0 >= max(l1, r1), spans  # the join started only after both were done
    assert daemon.stop() == 0


def test_a_failing_step_is_retried_then_fails_the_workflow_naming_it(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    _workflow(daemon, "brittle", """\
name: brittle
version: 0.1.0
steps:
  - id: first
    agent_ref: local://steady
  - id: shaky
    agent_ref: local://flaky
    depends_on: [first]
    retries:
      max_attempts: 3
      backoff: fixed
      on: [provider_error]
  - id: never
    agent_ref: local://steady
    depends_on: [shaky]
""")
    rune_agent(daemon, "steady", folder=daemon.home / "agents" / "brittle")
    rune_agent(daemon, "flaky", folder=daemon.home / "agents" / "brittle")
    daemon.start()
    fake_model.script(Reply(text="fine"), Reply.error(500), Reply.error(500), Reply.error(500))
    result = daemon.cli("dispatch", "go", "--agent", "brittle@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 4 and outcome["outcome"] == "step_failed", outcome
    assert "step 'shaky'" in outcome["error"] and "provider_error" in outcome["error"] and "3 attempts" in outcome["error"]
    assert len(fake_model.requests) == 4  # first once, shaky three times, never not at all
    children = record(daemon, outcome["intent_id"])["children"]
    assert [(c["step"], c["outcome"]) for c in children] == [
        ("first", "ok"), ("shaky", "provider_error"), ("shaky", "provider_error"), ("shaky", "provider_error")]
    assert daemon.stop() == 0


def test_conditions_skip_steps_and_templates_are_not_evaluated(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    _workflow(daemon, "branch", """\
name: branch
version: 0.1.0
output_step: "billing={{ steps.billing.output }} tech={{ steps.tech.output }}"
steps:
  - id: classify
    agent_ref: local://sorter
  - id: billing
    agent_ref: local://echo
    depends_on: [classify]
    condition: "{{ steps.classify.output }} == billing"
    input_template: "bill: {{ input }}"
  - id: tech
    agent_ref: local://echo
    depends_on: [classify]
    condition: "{{ steps.classify.output }} == technical"
    input_template: "tech: {{ input }} {{ steps.classify.output }}"
""")
    rune_agent(daemon, "sorter", folder=daemon.home / "agents" / "branch")
    daemon.add_agent("echo", "echo.py")
    daemon.start()
    fake_model.script(Reply(text="technical"))
    hostile = "{{ steps.classify.output }} {{ input }} {% import os %}"
    outcome = outcome_of(daemon.cli("dispatch", hostile, "--agent", "branch@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    # The input is substituted once and never rendered again; billing was skipped (empty output).
    assert outcome["text"] == f"billing= tech=tech: {hostile} technical"
    children = record(daemon, outcome["intent_id"])["children"]
    assert [c["step"] for c in children] == ["classify", "tech"]
    assert daemon.stop() == 0


def test_the_workflow_timeout_bounds_its_steps(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    _workflow(daemon, "hasty", """\
name: hasty
version: 0.1.0
timeout_ms: 1500
steps:
  - id: slow
    agent_ref: local://sleeper
""")
    rune_agent(daemon, "sleeper", folder=daemon.home / "agents" / "hasty")
    daemon.start()
    fake_model.script(Reply(text="too late", delay_s=8))
    result = daemon.cli("dispatch", "go", "--agent", "hasty@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 4 and outcome["outcome"] == "timeout" and "'slow'" in outcome["error"], outcome
    (child,) = record(daemon, outcome["intent_id"])["children"]
    assert child["outcome"] == "timeout"
    assert record(daemon, child["intent"])["outcome"] == "timeout"  # the step got no more than the workflow's time
    assert daemon.stop() == 0


def test_a_packages_own_workflow_runs_and_a_step_naming_the_package_runs_its_model(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    configure(daemon, ("fake", fake_model))
    package = rune_agent(daemon, "pipeline")
    (package / "workflow.yaml").write_text(textwrap.dedent("""\
        name: pipeline-flow
        version: 0.1.0
        steps:
          - id: think
            agent_ref: local://pipeline
            input_template: "think about {{ input }}"
          - id: shout
            agent_ref: local://echo
            input_template: "{{ steps.think.output }}!"
            depends_on: [think]
          - id: later
            agent_ref: local://not-installed
            depends_on: [shout]
            condition: "{{ steps.shout.output }} == never"
        """))
    daemon.add_agent("echo", "echo.py")
    checked = daemon.cli("agents", "check", "--json")
    warnings = [w["message"] for w in json.loads(checked.stdout)["warnings"]]
    assert checked.returncode == 0 and any("'later'" in w and "not-installed" in w for w in warnings), checked.stdout
    daemon.start()
    # Loading takes it, but a run is refused before any step while a step's agent is missing, a branch's too.
    missing = daemon.cli("dispatch", "rain", "--agent", "pipeline@local")
    assert missing.returncode == 6 and "step 'later' (local://not-installed" in missing.stderr, missing.stderr
    assert not fake_model.requests
    daemon.add_agent("not-installed", "echo.py")
    daemon.cli("reload", check=True)
    fake_model.script(Reply(text="a thought"))
    outcome = outcome_of(daemon.cli("dispatch", "rain", "--agent", "pipeline@local", "--json"))
    assert outcome["outcome"] == "ok" and outcome["text"] == "", outcome  # the last step was skipped: its output is empty
    (request,) = fake_model.requests
    assert request.messages[-1]["content"] == "think about rain"
    children = record(daemon, outcome["intent_id"])["children"]
    assert [(c["step"], c["agent"], c["outcome"]) for c in children] == [
        ("think", "pipeline@local", "ok"), ("shout", "echo@local", "ok")]
    assert record(daemon, children[1]["intent"])["result"]["text"] == "a thought!"
    assert daemon.stop() == 0


def _stop_during_the_first_step(d: DaemonProcess, fake_model: FakeModelServer, first_answer: Reply,
                                *daemon_args: str) -> tuple[int, dict, str]:
    """Run a workflow whose second step, a process agent, starts only after the first, a model's answer;
    SIGTERM the daemon while the model thinks. Returns the client's exit status, outcome and stderr."""
    configure(d, ("fake", fake_model))
    _workflow(d, "pair", """\
        name: pair
        version: 0.1.0
        timeout_ms: 60000
        output_step: echo
        steps:
          - id: think
            agent_ref: local://thinker
          - id: echo
            agent_ref: local://echo
            input_template: "said {{ steps.think.output }}"
            depends_on: [think]
        """)
    rune_agent(d, "thinker", folder=d.home / "agents" / "pair")
    d.add_agent("echo", "echo.py")
    d.start(*daemon_args)
    fake_model.script(first_answer)
    client = d.cli_background("dispatch", "go", "--agent", "pair@local", "--json")
    fake_model.wait_for_requests(1)
    assert d.process is not None
    d.process.send_signal(signal.SIGTERM)
    out, err = client.communicate(timeout=120)
    return client.returncode, json.loads(out), err


def test_a_stop_lets_a_running_workflow_start_its_next_steps_and_finish(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """The drain waits for in-flight intents, so their steps are not refused as new work (they were:
    shutting_down, and the workflow failed while the daemon reported a clean stop)."""
    status, outcome, err = _stop_during_the_first_step(daemon, fake_model, Reply(text="ONE", delay_s=2))
    assert status == 0 and outcome["outcome"] == "ok" and outcome["text"] == "said ONE", (outcome, err)
    assert daemon.process is not None and daemon.process.wait(timeout=120) == 0
    assert not agent_processes(daemon.home)


def test_past_the_drain_timeout_a_workflow_is_cancelled_and_starts_no_further_step(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    status, outcome, err = _stop_during_the_first_step(
        daemon, fake_model, Reply(text="far too late", delay_s=30), "--drain-timeout", "1")
    assert status == 5 and outcome["outcome"] == "cancelled", (outcome, err)
    assert outcome["error"] == "covenant stopped the intent: the daemon is shutting down"
    assert daemon.process is not None and daemon.process.wait(timeout=120) == 5
    steps = [r["data"] for r in audit(daemon, "intent.received") if r["data"].get("parent")]
    assert len(steps) == 1, "only the first step ever started"
    assert not agent_processes(daemon.home)


def test_a_workflow_out_of_time_ends_its_running_process_step_with_it(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """A process agent's step is bounded by the workflow's time like any child intent: it ran on to its own
    limit (120 s here) while the workflow, out of time, waited for it."""
    configure(daemon, ("fake", fake_model))
    _workflow(daemon, "lag", """\
        name: lag
        version: 0.1.0
        timeout_ms: 2000
        steps:
          - id: wait
            agent_ref: local://slow
        """)
    daemon.add_agent("slow", "slow.py", cpu_ms=300_000)
    daemon.start()
    started = time.monotonic()
    outcome = outcome_of(daemon.cli("dispatch", "sleep 120", "--agent", "lag@local", "--json"))
    assert outcome["outcome"] == "timeout" and time.monotonic() - started < 60, outcome
    [step] = record(daemon, outcome["intent_id"])["children"]
    assert step["outcome"] == "timeout"
    error = record(daemon, step["intent"])["error"]
    assert error.startswith("the agent did not finish before the intent that called it had to end"), error
    assert not agent_processes(daemon.home)


def test_a_failed_step_stops_a_running_process_step_beside_it(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    """The other steps of a failed workflow are cancelled: a process agent's run too (it ran to its end)."""
    configure(daemon, ("fake", fake_model))
    _workflow(daemon, "pair", """\
        name: pair
        version: 0.1.0
        timeout_ms: 300000
        steps:
          - id: wait
            agent_ref: local://slow
          - id: fail
            agent_ref: local://thinker
        """)
    rune_agent(daemon, "thinker", folder=daemon.home / "agents" / "pair")
    daemon.add_agent("slow", "slow.py", cpu_ms=300_000)
    daemon.start()
    fake_model.script(Reply.error(500, delay_s=1))
    started = time.monotonic()
    outcome = outcome_of(daemon.cli("dispatch", "sleep 120", "--agent", "pair@local", "--json"))
    assert outcome["outcome"] == "step_failed" and time.monotonic() - started < 60, outcome
    steps = {c["step"]: c for c in record(daemon, outcome["intent_id"])["children"]}
    assert steps["fail"]["outcome"] == "provider_error" and steps["wait"]["outcome"] == "cancelled", steps
    error = record(daemon, steps["wait"]["intent"])["error"]
    assert error == "covenant stopped the intent: the intent that called it ended", error
    assert daemon.stop() == 0 and not agent_processes(daemon.home)
