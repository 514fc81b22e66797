"""Workflows are checked whole before their first step runs: every step routed and decided, branches too.

Real daemons, process agents (no model needed): ``mark`` leaves a file named after its intent, so an
empty folder proves a step's agent never ran; ``gate`` holds a step running until the test lets it go.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path
from typing import Any

from tests.daemon.conftest import DaemonProcess
from tests.daemon.test_daemon_e2e import agent_processes
from tests.workflow.conftest import audit, record

GUARDED = """\
    name: guarded
    version: 0.1.0
    steps:
      - id: first
        agent_ref: local://mark
        input_template: "mark {{ input }}"
      - id: second
        agent_ref: local://echo
        depends_on: [first]
      - id: branch
        agent_ref: local://auditor
        depends_on: [second]
        condition: "{{ steps.second.output }} == never"
    """


def _workflow(d: DaemonProcess, folder: str, text: str) -> None:
    root = d.home / "agents" / folder
    root.mkdir(parents=True, exist_ok=True)
    (root / "workflow.yaml").write_text(textwrap.dedent(text))


def _shared_folder(d: DaemonProcess, name: str) -> Path:
    folder = d.home.parent / name
    folder.mkdir()
    os.chmod(folder, 0o777)  # agents run as agent uids of their own
    return folder


def _decisions_of(d: DaemonProcess, agent: str) -> list[dict[str, Any]]:
    return [r["data"] for r in audit(d, "policy.decision") if r["data"].get("agent") == agent]


def _plan_lines(stdout: str) -> dict[str, str]:
    """The dry run's step lines by step label (``first``, ``call > deep``)."""
    lines = {}
    for line in stdout.splitlines():
        label, sep, rest = line.strip().partition(": ")
        if sep and (" -> " in rest):
            lines[label] = rest
    return lines


def test_a_step_the_issuer_may_not_run_refuses_the_workflow_before_its_first_step(daemon: DaemonProcess) -> None:
    marks = _shared_folder(daemon, "marks")
    daemon.add_agent("mark", "mark.py")
    daemon.add_agent("echo", "echo.py", required=("tool.echo",))
    daemon.add_agent("auditor", "echo.py", required=("tool.audit",))
    _workflow(daemon, "guarded", GUARDED)
    daemon.start()
    args = ("dispatch", str(marks), "--agent", "guarded@local")

    # The dry run shows every step with its route and decision, and answers as the run would: exit 3.
    dry = daemon.cli(*args, "--dry-run")
    assert dry.returncode == 3, dry.stdout + dry.stderr
    steps = _plan_lines(dry.stdout)
    assert steps["first"] == "local://mark -> mark@local; needs no capabilities; allowed", dry.stdout
    assert steps["second"] == ("local://echo -> echo@local, after first; needs tool.echo; "
                               "DENIED: missing tool.echo (covenant grant tester@test tool.echo)"), dry.stdout
    assert steps["branch"] == ("local://auditor -> auditor@local, after second, if {{ steps.second.output }} == never; "
                               "needs tool.audit; DENIED: missing tool.audit (covenant grant tester@test tool.audit)")
    assert "would be refused: 2 steps may not run (second, branch)" in dry.stdout
    dry_json = daemon.cli(*args, "--dry-run", "--json")
    assert dry_json.returncode == 3
    error = json.loads(dry_json.stdout)["error"]
    assert error["code"] == "workflow_denied" and error["missing"] == ["tool.echo", "tool.audit"]
    plan = error["workflow"]
    assert [[(s["step"], s["agent"], s["routed_by"], s["decision"]) for s in wave] for wave in plan["waves"]] == [
        [("first", "mark@local", "explicit", "allow")], [("second", "echo@local", "explicit", "deny")],
        [("branch", "auditor@local", "explicit", "deny")]]
    assert plan["waves"][2][0]["conditional"] is True and plan["waves"][2][0]["missing"] == ["tool.audit"]
    assert plan["allowed"] is False and plan["denied"] == ["second", "branch"]

    # The run itself: refused before step 1 spawns, each refused step named with its fix.
    refused = daemon.cli(*args)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    message = refused.stderr
    assert "issuer tester@test may not run workflow guarded@local: 2 of its 3 steps may not run" in message
    assert "step 'second' (echo@local): missing tool.echo" in message
    assert "step 'branch' (auditor@local, behind a condition): missing tool.audit" in message
    assert "covenant grant tester@test tool.echo tool.audit" in message
    as_json = json.loads(daemon.cli(*args, "--json").stdout)["error"]
    assert [(s["step"], s["agent"], s["missing"], s["hint"]) for s in as_json["steps"]] == [
        ("second", "echo@local", ["tool.echo"], "covenant grant tester@test tool.echo"),
        ("branch", "auditor@local", ["tool.audit"], "covenant grant tester@test tool.audit")]
    assert not list(marks.iterdir()), "step 1's agent ran"
    assert daemon.api("GET", "/v1/dispatches?limit=50") == {"dispatches": []}
    assert not [r for r in audit(daemon, "intent.received") if r["data"].get("parent")], "a step intent was made"
    assert not audit(daemon, "agent.spawned")
    denials = _decisions_of(daemon, "guarded@local")
    assert len(denials) == 4 and all(d["allowed"] is False and d["reason"] == "workflow_denied" for d in denials)
    assert denials[-1]["hint"] == "covenant grant tester@test tool.echo tool.audit"
    assert [(s["step"], s["decision"], s["missing"]) for s in denials[-1]["steps"]] == [
        ("first", "allow", []), ("second", "deny", ["tool.echo"]), ("branch", "deny", ["tool.audit"])]
    history = json.loads(daemon.cli("history", "--json", check=True).stdout)
    assert history and history[0]["outcome"] == "denied" and history[0]["reason"] == "workflow_denied"

    # A step behind a condition that will not hold is checked all the same: the issuer asked for every branch.
    daemon.cli("grant", "tester@test", "tool.echo", check=True)
    branch_only = daemon.cli(*args)
    assert branch_only.returncode == 3 and "1 of its 3 steps" in branch_only.stderr, branch_only.stderr
    assert "'branch'" in branch_only.stderr and "'second'" not in branch_only.stderr
    assert not list(marks.iterdir())

    daemon.cli("grant", "tester@test", "tool.audit", check=True)
    allowed = daemon.cli(*args, "--dry-run")
    assert allowed.returncode == 0, allowed.stderr
    assert _plan_lines(allowed.stdout)["branch"].endswith("; allowed") and "every step may run" in allowed.stdout
    assert json.loads(daemon.cli(*args, "--dry-run", "--json", check=True).stdout)["workflow"]["allowed"] is True
    ran = daemon.cli(*args, "--json")
    assert ran.returncode == 0, ran.stderr + daemon.log()[-4000:]
    outcome = json.loads(ran.stdout)
    assert outcome["outcome"] == "ok" and outcome["text"] == "", outcome  # the last step, skipped: empty
    children = record(daemon, outcome["intent_id"])["children"]
    assert [(c["step"], c["outcome"]) for c in children] == [("first", "ok"), ("second", "ok")]
    assert [p.name for p in marks.iterdir()] == [children[0]["intent"]]
    allowed_decision = _decisions_of(daemon, "guarded@local")[-1]
    assert allowed_decision["allowed"] is True and [s["decision"] for s in allowed_decision["steps"]] == ["allow"] * 3
    assert daemon.stop() == 0
    assert daemon.cli("audit", "verify").returncode == 0


def test_missing_agents_remote_urls_and_nested_workflows_are_checked_and_a_revoked_grant_still_stops_a_step(
    daemon: DaemonProcess,
) -> None:
    marks = _shared_folder(daemon, "marks")
    gate = _shared_folder(daemon, "gate")
    daemon.add_agent("mark", "mark.py")
    daemon.add_agent("echo", "echo.py", required=("tool.echo",))
    daemon.add_agent("vault", "echo.py", required=("tool.vault",))
    daemon.add_agent("waiter", "gate.py")
    _workflow(daemon, "lost", """\
        name: lost
        version: 0.1.0
        steps:
          - id: one
            agent_ref: local://mark
            input_template: "mark {{ input }}"
          - id: two
            agent_ref: local://not-installed
            depends_on: [one]
            condition: "{{ steps.one.output }} != marked"
        """)
    _workflow(daemon, "far", """\
        name: far
        version: 0.1.0
        steps:
          - id: one
            agent_ref: local://mark
            input_template: "mark {{ input }}"
          - id: away
            agent_ref: https://agents.example/a2a/helper
            depends_on: [one]
        """)
    _workflow(daemon, "inner", """\
        name: inner
        version: 0.1.0
        steps:
          - id: deep
            agent_ref: local://vault
        """)
    _workflow(daemon, "outer", """\
        name: outer
        version: 0.1.0
        steps:
          - id: one
            agent_ref: local://mark
            input_template: "mark {{ input }}"
          - id: call
            agent_ref: local://inner
            depends_on: [one]
        """)
    _workflow(daemon, "held", """\
        name: held
        version: 0.1.0
        steps:
          - id: wait
            agent_ref: local://waiter
          - id: after
            agent_ref: local://echo
            depends_on: [wait]
        """)
    daemon.start()

    # A step whose agent is not loaded: no_agent (exit 6), named, and nothing ran.
    lost = daemon.cli("dispatch", str(marks), "--agent", "lost@local")
    assert lost.returncode == 6, lost.stdout + lost.stderr
    assert "workflow lost@local cannot run" in lost.stderr
    assert "step 'two' (local://not-installed, behind a condition): no_agent:" in lost.stderr
    lost_plan = json.loads(daemon.cli("dispatch", str(marks), "--agent", "lost@local", "--dry-run", "--json").stdout)
    (two,) = lost_plan["error"]["workflow"]["waves"][1]
    assert lost_plan["error"]["code"] == "no_agent" and two["agent"] is None and two["reason"] == "no_agent"
    assert "not-installed" in two["problem"]

    # A step whose agent an operator stopped: named with the command that starts it again.
    daemon.cli("stop", "mark", check=True)
    stopped = daemon.cli("dispatch", str(marks), "--agent", "lost@local")
    assert stopped.returncode == 6 and "workflow lost@local cannot run: 2 of its 2 steps" in stopped.stderr, stopped.stderr
    assert "step 'one' (local://mark): agent_stopped:" in stopped.stderr and "covenant start mark@local" in stopped.stderr
    daemon.cli("start", "mark", check=True)

    # A remote step outside [a2a] remotes: refused before step 1, no call made.
    far = daemon.cli("dispatch", str(marks), "--agent", "far@local", "--json")
    assert far.returncode == 3
    (away,) = json.loads(far.stdout)["error"]["steps"]
    assert away["step"] == "away" and away["reason"] == "remote" and "[a2a] remotes" in away["message"]
    assert not audit(daemon, "a2a.call")

    # A step that runs another workflow: that workflow's steps are checked too, before the outer step 1.
    outer = daemon.cli("dispatch", str(marks), "--agent", "outer@local")
    assert outer.returncode == 3 and "step 'call > deep' (vault@local): missing tool.vault" in outer.stderr, outer.stderr
    nested = _plan_lines(daemon.cli("dispatch", str(marks), "--agent", "outer@local", "--dry-run").stdout)
    assert nested["call"].startswith("local://inner -> inner@local") and nested["call"].endswith("; allowed")
    assert nested["call > deep"].startswith("local://vault -> vault@local; needs tool.vault; DENIED")
    assert not list(marks.iterdir()), "a first step ran"
    assert not [r for r in audit(daemon, "intent.received") if r["data"].get("parent")]

    # Checked before, decided again when it runs: a grant revoked while step 1 runs stops step 2 (fail closed).
    daemon.cli("grant", "tester@test", "tool.echo", check=True)
    client = daemon.cli_background("dispatch", str(gate), "--agent", "held@local", "--json")
    try:
        _wait_for_file(gate / "started", client)
        daemon.cli("revoke", "tester@test", "tool.echo", check=True)
    finally:
        (gate / "go").write_text("")
    out, err = client.communicate(timeout=120)
    outcome = json.loads(out)
    assert client.returncode == 4 and outcome["outcome"] == "step_failed", (outcome, err)
    assert "step 'after'" in outcome["error"] and "capability_denied" in outcome["error"]
    steps = {c["step"]: c for c in record(daemon, outcome["intent_id"])["children"]}
    assert steps["wait"]["outcome"] == "ok" and steps["after"]["outcome"] == "capability_denied"
    assert daemon.stop() == 0 and not agent_processes(daemon.home)


def _wait_for_file(path: Path, client: Any, timeout_s: float = 90) -> None:
    """Until ``path`` exists; fails at once, with the client's answer, when the client ended first."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if client.poll() is not None:
            raise AssertionError(f"the dispatch ended before its first step started: {client.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout_s} s")
        time.sleep(0.05)
