"""Operating Rune agents: covenant run, dry-run, status, restart, logs, eager start, idle stop, reload, drain."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO_ROOT
from tests.daemon.conftest import DaemonProcess
from tests.daemon.test_daemon_e2e import audit_records
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.processes import alive, ctrl_c
from tests.rune.conftest import KEY_ENV, add_process_tool, add_rune_agent, configure, outcome_of


def wait_for(predicate, timeout: float = 60, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def replicas(d: DaemonProcess) -> list[dict]:
    return d.api("GET", "/v1/status")["replicas"]  # type: ignore[index]


def test_covenant_run_of_a_rune_package(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    package = add_rune_agent(daemon)
    fake_model.script(Reply.tools(ToolCall("system-time", {})), Reply(text="It is now."))
    result = daemon.cli("run", str(package), "what time?")
    assert result.returncode == 0 and result.stdout == "It is now.\n", result
    assert [m["role"] for m in fake_model.requests[1].messages] == ["system", "user", "assistant", "tool"]
    fake_model.script(Reply.tools(ToolCall("system-time", {})), Reply.tools(ToolCall("system-time", {})))
    add_rune_agent(daemon, "stepper", max_steps=2)
    failed = daemon.cli("run", str(daemon.home / "agents" / "stepper"), "again", "--json")
    assert failed.returncode == 4 and json.loads(failed.stdout)["outcome"] == "max_steps_exceeded"


def test_covenant_run_says_which_tools_the_model_is_not_offered_and_still_answers(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """No daemon log to look in: an unavailable built-in and an MCP server that cannot start are on stderr."""
    configure(daemon, ("fake", fake_model), extra='[mcp.gone]\ncommand = ["/bin/false"]\n')
    package = add_rune_agent(daemon, toolset=("rune@system-time", "rune@web-search", "gone/lookup"))
    fake_model.script(Reply(text="Answered without them."))
    result = daemon.cli("run", str(package), "hi")
    assert result.returncode == 0 and result.stdout == "Answered without them.\n", result
    assert fake_model.requests[0].tool_names == ["system-time"]
    lines = result.stderr.splitlines()
    assert any(line.startswith("covenant: chat@local: toolset entry rune@web-search is not offered to the model: ")
               for line in lines), result.stderr
    assert any(line.startswith("covenant: chat@local: toolset entry gone/lookup is not offered to the model: ")
               and "gone" in line for line in lines), result.stderr


def test_covenant_runs_key_never_reaches_a_process_tool(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    """`covenant run` holds the provider key in its own environment; the tools it runs get the agents'
    environment, built from the allowlist, never its own."""
    configure(daemon, ("fake", fake_model))
    package = add_rune_agent(daemon, toolset=("envdump",))
    add_process_tool(package, "envdump",
        "import json, os, sys\njson.load(sys.stdin)\n"
        "print(json.dumps({'names': sorted(os.environ), 'key': any('sk-test-' in v for v in os.environ.values())}))\n")
    fake_model.script(Reply.tools(ToolCall("envdump", {})), Reply(text="done"))
    result = daemon.cli("run", str(package), "show me your environment")
    assert result.returncode == 0, result
    seen = json.loads([m for m in fake_model.requests[1].messages if m["role"] == "tool"][-1]["content"])
    assert KEY_ENV not in seen["names"] and seen["key"] is False, seen
    assert "PATH" in seen["names"]  # the tool did run and report


def _with_a_stdio_server_under_tmp(
    d: DaemonProcess, fake_model: FakeModelServer, folder: Path, tool: str = "look"
) -> tuple[Path, Path]:
    """(the server's script, the package): tests/fakes/mcp_stdio_server.py copied to ``folder`` as
    ``[mcp.hostile]``, and the agent chat@local with its tool ``hostile/<tool>``."""
    script = folder / "server.py"
    shutil.copy(REPO_ROOT / "tests" / "fakes" / "mcp_stdio_server.py", script)
    script.chmod(0o644)
    configure(d, ("fake", fake_model), extra=f'[mcp.hostile]\ncommand = ["{sys.executable}", "{script}"]\n')
    return script, add_rune_agent(d, toolset=(f"hostile/{tool}",))


def test_covenant_run_keeps_a_stdio_servers_program_visible_in_the_private_tmp(
    daemon: DaemonProcess, fake_model: FakeModelServer, agent_reachable_dir: Path
) -> None:
    """A server whose script lives under /tmp: the agent uid's private /tmp covers the host's, so the
    paths a server's command names are bound back into it, under `covenant run` as under the daemon."""
    script, package = _with_a_stdio_server_under_tmp(daemon, fake_model, agent_reachable_dir)
    fake_model.script(Reply.tools(ToolCall("hostile__look", {"path": str(script)})), Reply(text="seen"))
    result = daemon.cli("run", str(package), "look")
    assert result.returncode == 0 and result.stdout == "seen\n", result
    assert fake_model.requests[0].tool_names == ["hostile__look"], result.stderr
    seen = json.loads([m for m in fake_model.requests[1].messages if m["role"] == "tool"][-1]["content"])
    assert seen["exists"] is True, seen


def test_a_grandchild_an_mcp_server_left_behind_does_not_outlive_covenant_run(
    daemon: DaemonProcess, fake_model: FakeModelServer, agent_reachable_dir: Path
) -> None:
    script, package = _with_a_stdio_server_under_tmp(daemon, fake_model, agent_reachable_dir, tool="escape")
    fake_model.script(Reply.tools(ToolCall("hostile__escape", {})), Reply(text="left one behind"))
    result = daemon.cli("run", str(package), "escape")
    assert result.returncode == 0 and result.stdout == "left one behind\n", result
    escapee = json.loads([m for m in fake_model.requests[1].messages if m["role"] == "tool"][-1]["content"])["pid"]
    wait_for(lambda: not alive(escapee), timeout=10, what=f"the escaped grandchild {escapee} to be gone")


def test_interrupting_covenant_run_leaves_no_mcp_server_behind(
    daemon: DaemonProcess, fake_model: FakeModelServer, agent_reachable_dir: Path
) -> None:
    script, package = _with_a_stdio_server_under_tmp(daemon, fake_model, agent_reachable_dir)
    fake_model.script(Reply(text="never read", delay_s=120))
    run = daemon.cli_background("run", str(package), "wait")
    try:
        wait_for(lambda: len(fake_model.requests) == 1, what="the model request (its MCP server is up by then)")
        servers = [p for p in psutil.process_iter(["cmdline"]) if str(script) in (p.info["cmdline"] or [])]
        assert servers
    finally:
        ctrl_c(run)
    wait_for(lambda: not any(alive(p.pid) for p in servers), timeout=30, what="the MCP server to be gone")


def test_dry_run_names_provider_model_and_unavailable_tools(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, toolset=("rune@system-time", "rune@web-search"), providers=("missing", "fake"))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.system_time", "tool.web_search", check=True)
    result = daemon.cli("dispatch", "hi", "--agent", "chat@local", "--dry-run", "--json")
    plan = outcome_of(result)["rune"]
    assert result.returncode == 0
    first = plan["model"]["providers"][0]
    assert first["provider"] == "fake" and first["model"] == "fake-model"
    assert plan["model"]["skipped"][0]["provider"] == "missing"
    assert [u["tool"] for u in plan["unavailable_tools"]] == ["rune@web-search"]
    assert not fake_model.requests and replicas(daemon) == []  # nothing started
    text = daemon.cli("dispatch", "hi", "--agent", "chat@local", "--dry-run", check=True).stdout
    assert "model: fake-model from provider fake" in text and "skipped provider missing" in text
    assert "unavailable tool rune@web-search" in text


def test_status_restart_and_replica_logs(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, toolset=())
    daemon.start()
    fake_model.script(Reply(text="one"), Reply(text="two"))
    assert outcome_of(daemon.cli("dispatch", "a", "--agent", "chat@local", "--json"))["outcome"] == "ok"
    (before,) = replicas(daemon)
    assert before["state"] == "ready" and before["in_flight"] == 0 and before["restarts"] == 0
    text = daemon.cli("status", check=True).stdout
    assert f"replica    chat@local: ready, pid {before['pid']}" in text
    restarted = daemon.cli("restart", "chat", check=True)
    assert "restarted the replica of chat@local" in restarted.stdout
    wait_for(lambda: replicas(daemon)[0]["state"] == "ready", what="the new replica")
    assert replicas(daemon)[0]["pid"] != before["pid"]
    assert not alive(before["pid"])
    assert outcome_of(daemon.cli("dispatch", "b", "--agent", "chat@local", "--json"))["text"] == "two"
    logs = daemon.cli("logs", check=True).stdout
    assert "replica serving" in logs and "chat@local" in logs
    not_rune = daemon.cli("restart", "nobody")
    assert not_rune.returncode == 6


def test_eager_start_and_idle_stop(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model), extra="[rune]\nstart = \"eager\"\nidle_stop_s = 2\n")
    add_rune_agent(daemon, toolset=())
    daemon.start()
    wait_for(lambda: [r["state"] for r in replicas(daemon)] == ["ready"], what="an eager replica")
    pid = replicas(daemon)[0]["pid"]
    wait_for(lambda: replicas(daemon)[0]["state"] == "stopped", what="the idle stop")
    assert not alive(pid)
    fake_model.script(Reply(text="woken"))
    assert outcome_of(daemon.cli("dispatch", "a", "--agent", "chat@local", "--json"))["text"] == "woken"


def test_a_replica_that_cannot_start_fails_fast_and_shows_why(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    folder = add_rune_agent(daemon, toolset=())
    runefile = folder / "Runefile"
    runefile.write_text(runefile.read_text().replace("toolset: []", "toolset: []\nskills: [acme/kit/missing]"))
    daemon.start()
    result = daemon.cli("dispatch", "a", "--agent", "chat@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 4 and outcome["outcome"] == "spawn_failed", outcome
    assert "skills/acme/kit/skills/missing/SKILL.md" in outcome["error"]
    (replica,) = replicas(daemon)
    assert "acme/kit/missing" in replica["last_error"]


def test_reload_with_a_changed_package_replaces_the_replica(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    folder = add_rune_agent(daemon, toolset=())
    daemon.start()
    fake_model.script(Reply(text="v1"), Reply(text="v2"))
    assert outcome_of(daemon.cli("dispatch", "a", "--agent", "chat@local", "--json"))["text"] == "v1"
    old = replicas(daemon)[0]["pid"]
    runefile = folder / "Runefile"
    runefile.write_text(runefile.read_text().replace("covenant test agent.", "covenant test agent, version two."))
    daemon.cli("reload", check=True)
    wait_for(lambda: replicas(daemon)[0]["pid"] not in (old, None) and replicas(daemon)[0]["state"] == "ready",
             what="the replacement replica")
    assert outcome_of(daemon.cli("dispatch", "b", "--agent", "chat@local", "--json"))["text"] == "v2"
    assert "version two" in fake_model.requests[-1].messages[0]["content"]


def test_sigterm_drains_an_in_flight_rune_intent(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, toolset=())
    daemon.start()
    fake_model.script(Reply(text="finished in time", delay_s=2))
    pending = daemon.cli_background("dispatch", "slow", "--agent", "chat@local", "--json")
    fake_model.wait_for_requests(1)
    pid = replicas(daemon)[0]["pid"]
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGTERM)
    out, _ = pending.communicate(timeout=120)
    assert json.loads(out)["text"] == "finished in time"
    assert daemon.process.wait(timeout=120) == 0
    assert not alive(pid)


def stall_a_dispatch_at_its_decision_then_stop(daemon: DaemonProcess, fake_model: FakeModelServer,
                                              reply: Reply) -> tuple[subprocess.Popen[str], int]:
    """A dispatch held where it writes its decision (the audit writer stopped) when SIGTERM comes.

    Returns the client and the writer's pid, still stopped: the caller resumes it (SIGCONT).
    """
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, toolset=())
    daemon.start()
    fake_model.script(Reply(text="warm"), reply)
    assert outcome_of(daemon.cli("dispatch", "warm up", "--agent", "chat@local", "--json"))["text"] == "warm"
    writer = daemon.api("GET", "/v1/status")["audit"]["writer_pid"]  # type: ignore[index]
    os.kill(writer, signal.SIGSTOP)
    try:
        client = daemon.cli_background("dispatch", "stalled", "--agent", "chat@local", "--json")
        wait_for(lambda: daemon.api("GET", "/v1/status")["admitted"] == 1, what="the dispatch admitted")
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGTERM)
        wait_for(lambda: drain_lines(daemon), what="the drain")
    except BaseException:
        os.kill(writer, signal.SIGCONT)
        raise
    assert "in_flight=1 " in drain_lines(daemon)[0], "the drain must count the stalled dispatch"
    return client, writer


def drain_lines(daemon: DaemonProcess) -> list[str]:
    return [line for line in daemon.log().splitlines() if "msg=draining " in line]


def test_the_drain_waits_for_a_dispatch_still_writing_its_decision(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """Accepted before the stop, so it is waited for: it ran after the drain had begun, once its decision
    was durable, and was answered. (It was cut off: the drain saw nothing running and ended.)"""
    client, writer = stall_a_dispatch_at_its_decision_then_stop(
        daemon, fake_model, Reply(text="answered after the stop", delay_s=7))  # past the drain's 5 s for replies
    os.kill(writer, signal.SIGCONT)
    out, err = client.communicate(timeout=120)
    assert client.returncode == 0 and json.loads(out)["text"] == "answered after the stop", out + err
    assert daemon.process is not None and daemon.process.wait(timeout=120) == 0
    completed = [r["data"] for r in audit_records(daemon) if r["type"] == "intent.completed"]
    assert [c["outcome"] for c in completed] == ["ok", "ok"]
    assert daemon.cli("audit", "verify").returncode == 0


def test_a_second_stop_signal_cancels_a_dispatch_still_writing_its_decision(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """Its replica is never asked: the cancel came before its cancel scope existed, and still reaches it."""
    client, writer = stall_a_dispatch_at_its_decision_then_stop(daemon, fake_model, Reply(text="never asked"))
    try:
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGTERM)
        wait_for(lambda: "second stop signal" in daemon.log_path.read_text(), what="the second signal handled")
    finally:
        os.kill(writer, signal.SIGCONT)
    out, err = client.communicate(timeout=120)
    assert client.returncode == 5 and json.loads(out)["outcome"] == "cancelled", out + err
    assert daemon.process.wait(timeout=120) == 5
    assert len(fake_model.requests) == 1, "only the warm-up reached the model"
    completed = [r["data"] for r in audit_records(daemon) if r["type"] == "intent.completed"]
    assert [c["outcome"] for c in completed] == ["ok", "cancelled"]
    assert daemon.cli("audit", "verify").returncode == 0


def test_sessions_commands_without_a_daemon(daemon: DaemonProcess) -> None:
    from covenant.rune.sessions import SessionLog, session_path

    root = daemon.home / "state" / "sessions"
    for name in ("one", "two"):
        log = SessionLog.new(session_path(root, "chat@local", name), agent="chat@local", session=name,
                             issuer="ab" * 32, now_ms=1)
        log.append_turn("i1", [{"role": "user", "content": f"hello {name}"}, {"role": "assistant", "content": "hi"}])
    listed = json.loads(daemon.cli("sessions", "list", "--json", check=True).stdout)
    assert [(r["agent"], r["session"], r["turns"], r["valid"]) for r in listed] == [
        ("chat@local", "one", 1, True), ("chat@local", "two", 1, True)]
    shown = daemon.cli("sessions", "show", "chat", "one", check=True).stdout
    assert "user: hello one" in shown and "assistant: hi" in shown
    two = session_path(root, "chat@local", "two")
    two.write_bytes(two.read_bytes().replace(b"hello two", b"hello 2wo"))
    refused = daemon.cli("sessions", "show", "chat@local", "two")
    assert refused.returncode == 1 and "refused" in refused.stderr and "hello 2wo" not in refused.stdout
    assert daemon.cli("sessions", "verify", "chat@local").returncode == 1
    daemon.cli("sessions", "rm", "chat@local", "two", check=True)
    assert not two.exists() and daemon.cli("sessions", "verify").returncode == 0
    assert daemon.cli("sessions", "show", "chat@local", "../x").returncode == 2


def test_concurrency_limit_waits_in_the_daemon_and_request_timeout(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, toolset=(), runtime="""
        concurrency_limit: 1
        request_timeout_ms: 4000
        startup_timeout_ms: 30000
    """)
    daemon.start()
    fake_model.script(Reply(text="first", delay_s=1.5), Reply(text="second", delay_s=1.5))
    clients = [daemon.cli_background("dispatch", f"n{n}", "--agent", "chat@local", "--json") for n in range(2)]
    seen_two = False
    while any(c.poll() is None for c in clients):
        status = daemon.api("GET", "/v1/status")
        for replica in status["replicas"]:  # type: ignore[index]
            assert replica["in_flight"] <= 1
        seen_two = seen_two or len(status["in_flight"]) == 2  # type: ignore[index, arg-type]
        time.sleep(0.05)
    texts = sorted(json.loads(c.communicate()[0])["text"] for c in clients)
    assert texts == ["first", "second"] and seen_two

    fake_model.script(Reply(text="far too late", delay_s=8))
    result = daemon.cli("dispatch", "slow", "--agent", "chat@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 4 and outcome["outcome"] == "timeout" and "request_timeout_ms = 4000" in outcome["error"]


def test_a_replica_that_stops_answering_probes_is_replaced(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model), extra="[rune]\nstart = \"eager\"\n")
    add_rune_agent(daemon, toolset=())
    daemon.start()
    wait_for(lambda: [r["state"] for r in replicas(daemon)] == ["ready"], what="the replica")
    frozen = replicas(daemon)[0]["pid"]
    os.kill(frozen, signal.SIGSTOP)  # alive, but it answers nothing
    wait_for(lambda: replicas(daemon)[0]["restarts"] == 1 and replicas(daemon)[0]["state"] == "ready", timeout=90,
             what="a replacement after three failed probes")
    (replica,) = replicas(daemon)
    assert replica["pid"] != frozen and "health probes in a row failed" in replica["last_error"]
    assert not alive(frozen)
    fake_model.script(Reply(text="fresh"))
    assert outcome_of(daemon.cli("dispatch", "a", "--agent", "chat@local", "--json"))["text"] == "fresh"


def test_a_full_replica_with_a_full_queue_answers_overloaded(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model), extra="[daemon]\nqueue_max = 1\n")
    add_rune_agent(daemon, toolset=(), runtime="""
        concurrency_limit: 1
        startup_timeout_ms: 30000
    """)
    daemon.start()
    fake_model.script(Reply(text="one", delay_s=3), Reply(text="two"))
    first = daemon.cli_background("dispatch", "a", "--agent", "chat@local", "--json")
    wait_for(lambda: [r["in_flight"] for r in replicas(daemon)] == [1], what="the first on the replica")
    second = daemon.cli_background("dispatch", "b", "--agent", "chat@local", "--json")
    wait_for(lambda: replicas(daemon)[0]["waiting"] == 1, what="the second waiting in the daemon")
    third = daemon.cli("dispatch", "c", "--agent", "chat@local", "--json")
    assert third.returncode == 5 and "already wait for the replica of chat@local" in third.stderr, third
    assert [json.loads(c.communicate()[0])["text"] for c in (first, second)] == ["one", "two"]


def test_covenant_run_refuses_a_tool_agent_uids_cannot_read(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: an unprivileged covenant runs tools as its own uid, so nothing is unreachable")
    configure(daemon, ("fake", fake_model))
    package = add_rune_agent(daemon, toolset=("shout",))
    (package / "tools").mkdir()
    (package / "tools" / "shout.yaml").write_text("name: shout\nruntime: process\nmodule: tools/shout.py\n")
    (package / "tools" / "shout.py").write_text("import json, sys\nprint(json.dumps(json.load(sys.stdin)))\n")
    os.chmod(package / "tools", 0o700)
    result = daemon.cli("run", str(package), "hi")
    assert result.returncode == 2 and str(package / "tools" / "shout.py") in result.stderr, result
    assert not fake_model.requests


def test_a_crash_loop_backs_off_and_shows_in_status(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    configure(daemon, ("fake", fake_model), extra='[rune]\npython = "/bin/false"\n')  # exits at once, every time
    add_rune_agent(daemon, toolset=())
    daemon.start()
    t0 = time.monotonic()
    result = daemon.cli("dispatch", "a", "--agent", "chat@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 4 and outcome["outcome"] == "spawn_failed", outcome
    assert "exited before it became healthy" in outcome["error"]
    wait_for(lambda: replicas(daemon)[0]["restarts"] >= 3, timeout=60, what="three restarts")
    took = time.monotonic() - t0
    assert took >= 1 + 2  # the backoff doubles: 1 s, then 2 s, before the third restart
    (replica,) = replicas(daemon)
    assert replica["state"] in ("backoff", "starting") and "exited before it became healthy" in replica["last_error"]
    text = daemon.cli("status", check=True).stdout
    assert "replica    chat@local:" in text and "restarts; last error: the replica exited before it became healthy" in text
    assert not fake_model.requests


def test_reload_mid_request_drains_then_one_new_replica_serves(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    from tests.daemon.conftest import agent_processes

    configure(daemon, ("fake", fake_model))
    folder = add_rune_agent(daemon, toolset=())
    daemon.start()
    fake_model.script(Reply(text="old answer", delay_s=3), Reply(text="new answer"))
    first = daemon.cli_background("dispatch", "a", "--agent", "chat@local", "--json")
    fake_model.wait_for_requests(1)
    old_pid = replicas(daemon)[0]["pid"]
    runefile = folder / "Runefile"
    runefile.write_text(runefile.read_text().replace("covenant test agent.", "covenant test agent, renewed."))
    daemon.cli("reload", check=True)
    second = daemon.cli_background("dispatch", "b", "--agent", "chat@local", "--json")
    assert json.loads(first.communicate(timeout=120)[0])["text"] == "old answer"  # drained, not cut
    assert json.loads(second.communicate(timeout=120)[0])["text"] == "new answer"
    assert "renewed" not in fake_model.requests[0].messages[0]["content"]
    assert "renewed" in fake_model.requests[1].messages[0]["content"]
    (replica,) = replicas(daemon)
    assert replica["pid"] != old_pid
    serving = [p for p in agent_processes(daemon.home) if "replicas" in (p.info.get("cwd") or "")]
    assert [p.pid for p in serving] == [replica["pid"]]  # exactly one replica for the agent


def test_a_session_in_flight_on_a_draining_replica_is_not_answered_beside_it_by_the_new_one(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """Two replicas of one agent live at once during a reload: one session's intents still go one at a time."""
    configure(daemon, ("fake", fake_model))
    folder = add_rune_agent(daemon, toolset=())
    daemon.start()
    fake_model.script(Reply(text="old answer", delay_s=3), Reply(text="new answer"), Reply(text="third answer"))
    first = daemon.cli_background("dispatch", "a", "--agent", "chat@local", "--json", "--session", "shared")
    fake_model.wait_for_requests(1)
    runefile = folder / "Runefile"
    runefile.write_text(runefile.read_text().replace("covenant test agent.", "covenant test agent, renewed."))
    daemon.cli("reload", check=True)
    second = daemon.cli_background("dispatch", "b", "--agent", "chat@local", "--json", "--session", "shared")
    assert json.loads(first.communicate(timeout=120)[0])["text"] == "old answer"
    assert json.loads(second.communicate(timeout=120)[0])["text"] == "new answer"
    # The second intent saw the first one's turn: it waited for it, and the file is one chain.
    assert [m["content"] for m in fake_model.requests[1].messages[1:]] == ["a", "old answer", "b"]
    assert daemon.cli("sessions", "verify", "chat@local", "shared").returncode == 0
    third = outcome_of(daemon.cli("dispatch", "c", "--agent", "chat@local", "--json", "--session", "shared"))
    assert third["outcome"] == "ok" and third["text"] == "third answer"


def test_a_broken_runefile_runs_the_old_package_with_its_old_tool_and_an_edited_tool_is_changed(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """Issue 39 items 1 and 3 for a Rune package: a broken Runefile beside an edited tool file keeps the old
    Runefile *and* the old tool (from the snapshot); an edited tool file alone is listed under `changed`."""
    configure(daemon, ("fake", fake_model))
    package = add_rune_agent(daemon, "chat", toolset=("say",))
    add_process_tool(package, "say", "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'said': 'old'}))\n")
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.say", check=True)

    def said() -> str:
        fake_model.script(Reply.tools(ToolCall("say", {})), Reply(text="done"))
        outcome = outcome_of(daemon.cli("dispatch", "say it", "--agent", "chat", "--json"))
        assert outcome["outcome"] == "ok", outcome
        answer = json.loads([m for m in fake_model.requests[-1].messages if m["role"] == "tool"][-1]["content"])
        return answer["said"]

    assert said() == "old"
    (package / "tools" / "say.py").write_text("import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'said': 'new'}))\n")
    doc = json.loads(daemon.cli("reload", "--json").stdout)
    assert doc["changed"] == ["chat@local"] and doc["rejected"] == [], doc
    assert said() == "new"

    (package / "tools" / "say.py").write_text("import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'said': 'newer'}))\n")
    (package / "Runefile").write_text((package / "Runefile").read_text().replace("max_steps: 4", "max_steps: many"))
    reloaded = daemon.cli("reload", "--json")
    doc = json.loads(reloaded.stdout)
    assert reloaded.returncode == 1 and doc["snapshot"] == ["chat@local"] and doc["changed"] == [], doc
    assert said() == "new"  # the last valid package's tool, not the edited one
