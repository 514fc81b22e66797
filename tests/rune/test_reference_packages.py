"""Packages written for the reference runtime (raftio/rune), unchanged, on a real daemon (issue 37 items 4, 5).

A real daemon and replica, the scripted fake model in place of the providers the packages name,
real HTTP servers on 127.0.0.1 for the search backend and the channel's webhook.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from covenant.triggers.agent_schedules import agent_schedules_path
from tests.conftest import rune_examples
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import configure, outcome_of
from tests.tools.test_search_channels import Recorder, local_http  # noqa: F401 - the fixture

CORPUS = Path(__file__).parent / "corpus"


def install(daemon: DaemonProcess, source: Path) -> Path:
    """Copy a package into the home's agents/, readable by agent uids and writable by no one else."""
    target = daemon.home / "agents" / source.name
    shutil.copytree(source, target)
    for folder, _dirs, files in os.walk(target):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    return target


def tool_answer(request, index: int = -1) -> dict:  # type: ignore[no-untyped-def]
    return json.loads([m for m in request.messages if m["role"] == "tool"][index]["content"])


def tool_events(daemon: DaemonProcess, intent: str) -> list[dict]:
    lines = daemon.cli("audit", "tail", "--json", "-n", "1000000", check=True).stdout.splitlines()
    return [r["data"] for r in map(json.loads, lines) if r["type"] == "tool.call" and r["data"]["intent"] == intent]


def test_a_package_with_a_wasm_and_a_container_tool_loads_and_runs_its_other_tools(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    install(daemon, CORPUS / "unrunnable-tools")
    configure(daemon, ("openai", fake_model))
    checked = daemon.cli("agents", "check", "--json")
    report = json.loads(checked.stdout)
    assert checked.returncode == 0 and report["valid"] is True, checked.stdout
    warned = " ".join(w["message"] for w in report["warnings"])
    assert "wasm_tool is unavailable here" in warned and "container_tool is unavailable here" in warned, warned

    daemon.start()
    listed = json.loads(daemon.cli("tools", "list", "unrunnable-tools", "--json", check=True).stdout)["tools"]
    rows = {t["entry"]: t for t in listed}
    assert rows["rune@system-time"]["available"] is True
    # Its module is the bare 8-byte header: no ABI this host runs (wasm tools themselves: tests/tools/test_wasm.py).
    assert rows["wasm_tool"]["available"] is False and "exports neither _start" in rows["wasm_tool"]["reason"]
    # No image in its module (nor any listed in [tools.container] images): container tools themselves in tests/tools/test_containers.py.
    assert rows["container_tool"]["available"] is False and "runtime 'container'" in rows["container_tool"]["reason"]
    plain = daemon.cli("tools", "list", "unrunnable-tools", check=True).stdout
    assert "exports neither _start" in plain, plain

    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(
        Reply.tools(ToolCall("wasm_tool", {})),  # a model that names it anyway gets an error, nothing runs
        Reply.tools(ToolCall("system-time", {})),
        Reply(text="It is now."),
    )
    outcome = outcome_of(daemon.cli("dispatch", "what time is it?", "--agent", "unrunnable-tools@local", "--json"))
    assert outcome["outcome"] == "ok" and outcome["text"] == "It is now.", outcome
    assert fake_model.requests[0].tool_names == ["system-time"]  # never offered the unrunnable ones
    assert tool_answer(fake_model.requests[1])["error"]["code"] == "unknown_tool"
    assert isinstance(tool_answer(fake_model.requests[2])["epoch_ms"], int)
    assert [(e["name"], e["outcome"]) for e in tool_events(daemon, outcome["intent_id"])] == [
        ("wasm_tool", "error"), ("system-time", "ok")]
    assert daemon.stop() == 0

    # An operator who wants no agent with a tool it cannot run says so; the same package is then refused.
    configure(daemon, ("openai", fake_model), extra='[rune]\nunavailable_tools = "refuse"\n')
    refused = daemon.cli("agents", "check")
    assert refused.returncode == 1 and "tool wasm_tool is unavailable here" in refused.stdout, refused.stdout


def test_the_corpus_scheduled_reporter_follows_its_own_instructions_end_to_end(
    daemon: DaemonProcess, fake_model: FakeModelServer, local_http: tuple[str, Recorder]
) -> None:
    """Every call the package's instructions tell the model to make, in the shape they say, succeeds."""
    base, recorder = local_http
    install(daemon, rune_examples() / "scheduled-reporter")
    secret = "whsec-" + os.urandom(8).hex()
    configure(daemon, ("openai", fake_model), extra=(
        f'[tools.web_search]\nurl = "{base}/search"\n'
        '[channels.telegram]\nurl_env = "TELEGRAM_HOOK_URL"\nsecret_env = "TELEGRAM_HOOK_KEY"\n'))
    daemon.env.update(TELEGRAM_HOOK_URL=f"{base}/hook", TELEGRAM_HOOK_KEY=secret)
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    agent = "scheduled-reporter@local"

    # "Call rune@schedule-create with: description, schedule, agent_name, channel, recipient"
    fake_model.script(
        Reply.tools(ToolCall("schedule-create", {
            "description": "top AI news", "schedule": "every 5 minutes", "agent_name": "scheduled-reporter",
            "channel": "telegram", "recipient": "@ada"})),
        Reply(text="Scheduled."),
    )
    created = outcome_of(daemon.cli("dispatch", "Send me the top AI news every 5 minutes on telegram, I am @ada",
                                    "--agent", agent, "--json"))
    assert created["outcome"] == "ok", created
    answer = tool_answer(fake_model.requests[-1])
    schedule_id = answer["schedule_id"]
    assert answer["created"] is True and answer["every"] == "5m" and answer["agent"] == agent, answer
    stored = json.loads(agent_schedules_path(daemon.home / "state").read_text())["schedules"][schedule_id]["schedule"]
    fires_with = stored["input"]
    assert fires_with.startswith(f"[SCHEDULED] top AI news (schedule_id: {schedule_id})\n")
    assert "[CHANNEL_CONTEXT] channel=telegram recipient=@ada" in fires_with

    # "list schedules" -> rune@schedule-list
    fake_model.script(Reply.tools(ToolCall("schedule-list", {})), Reply(text="One schedule."))
    assert outcome_of(daemon.cli("dispatch", "list schedules", "--agent", agent, "--json"))["outcome"] == "ok"
    assert [s["id"] for s in tool_answer(fake_model.requests[-1])["schedules"]] == [schedule_id]

    # "When a scheduled trigger fires": the firing's text, then web-search, channel-send, task-post.
    fake_model.script(
        Reply.tools(ToolCall("web-search", {"query": "top AI news", "max_results": 1})),
        Reply.tools(ToolCall("channel-send", {"channel": "telegram", "recipient": "@ada", "message": "AI news: covenant"})),
        Reply.tools(ToolCall("task-post", {"title": "AI news report", "description": "sent to @ada on telegram"})),
        Reply(text="Report sent."),
    )
    fired = outcome_of(daemon.cli("dispatch", fires_with, "--agent", agent, "--json"))
    assert fired["outcome"] == "ok" and fired["text"] == "Report sent.", fired
    searched, sent, posted = (tool_answer(r) for r in fake_model.requests[-3:])
    assert [r["url"] for r in searched["results"]] == ["https://example.org/covenant"]
    assert sent == {"sent": True, "channel": "telegram", "status": 200, "recipient": "@ada"}
    assert posted["posted"] is True
    [hook] = [r for r in recorder.requests if r[0] == "POST"]
    body = json.loads(hook[3])
    assert body["recipient"] == "@ada" and body["text"] == "AI news: covenant" and body["channel"] == "telegram"

    # "cancel schedule <id>" -> rune@schedule-delete with id
    fake_model.script(Reply.tools(ToolCall("schedule-delete", {"id": schedule_id})), Reply(text="Cancelled."))
    assert outcome_of(daemon.cli("dispatch", f"cancel schedule {schedule_id}", "--agent", agent, "--json"))["outcome"] == "ok"
    assert tool_answer(fake_model.requests[-1]) == {"deleted": True, "name": schedule_id}
    assert json.loads(agent_schedules_path(daemon.home / "state").read_text())["schedules"] == {}

    # The audit names covenant's arguments and says which of the reference's names were mapped.
    create_event, = tool_events(daemon, created["intent_id"])
    assert create_event["outcome"] == "ok"
    assert create_event["args_aliases"] == ["agent_name", "channel", "description", "recipient", "schedule"]
    assert [(e["name"], e["outcome"], e.get("args_aliases")) for e in tool_events(daemon, fired["intent_id"])] == [
        ("web-search", "ok", None), ("channel-send", "ok", ["message"]), ("task-post", "ok", ["description"])]
    assert not [e for e in fake_model.unscripted]
    assert daemon.stop() == 0


def test_skills_join_the_instructions_up_to_the_cap_and_routing_hints_are_kept_whole(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    """SKILL.md bodies reach the model's system prompt up to [rune] skill_prompt_kb; past it a skill is listed and
    read with skill-read (issue 37 item 6). routing_hints are shown whole; their keywords route."""
    install(daemon, CORPUS / "skilled-reporter")
    skills = daemon.home / "skills"
    shutil.copytree(CORPUS / "skills", skills)
    manual = skills / "covenant-tests" / "manuals" / "house-style"  # the <owner>/<repo>/<skill> layout
    manual.mkdir(parents=True)
    (manual / "SKILL.md").write_text("---\nname: house-style\ndescription: The house style of every report.\n---\n"
                                     "HOUSE-STYLE-BODY\n" + "Write plainly. " * 200 + "\n")
    (manual / "examples.md").write_text("an example report\n")
    for folder, _dirs, files in os.walk(skills):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    configure(daemon, ("openai", fake_model), extra="[rune]\nskill_prompt_kb = 2\n")
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)

    shown = json.loads(daemon.cli("agents", "show", "skilled-reporter", "--json", check=True).stdout)
    assert shown["routing_hints"] == {"keywords": ["status report"], "region": "eu-west", "tier": 2, "owners": ["web", "ops"]}
    assert shown["keywords"] == ["status report"]
    plain = daemon.cli("agents", "show", "skilled-reporter", check=True).stdout
    assert "routing_hints.region:" in plain and "eu-west" in plain and '["web", "ops"]' in plain, plain

    house = "covenant-tests/manuals/house-style"
    fake_model.script(
        Reply.tools(ToolCall("skill-read", {"skill": house})),
        Reply.tools(ToolCall("skill-read", {"skill": house, "path": "examples.md"})),
        Reply.tools(ToolCall("skill-read", {"skill": house, "path": "../../../../identity/daemon.key"})),
        Reply.tools(ToolCall("skill-read", {"skill": "anthropics/claude-code/frontend-design"})),  # in the prompt already
        Reply(text="Report written."),
    )
    # No --agent: the routing_hints keywords choose the agent.
    outcome = outcome_of(daemon.cli("dispatch", "write the weekly status report", "--json"))
    assert outcome["outcome"] == "ok" and outcome["agent"] == "skilled-reporter@local", outcome
    first = fake_model.requests[0]
    system = next(m["content"] for m in first.messages if m["role"] == "system")
    assert system.startswith("You write short status reports for a web team.")
    assert "## Skill: frontend-design (anthropics/claude-code/frontend-design)" in system
    assert "FRONTEND-SKILL-BODY-7f3a" in system  # the body itself, front matter left out
    assert "description: How this team" not in system
    assert "HOUSE-STYLE-BODY" not in system and f"- {house}: house-style — The house style of every report." in system
    assert len(system.encode()) < 2048 + 1024  # the bodies within the cap, the instructions and the list beside
    assert first.tool_names == ["system-time", "skill-read"]
    read, example, escaped, inlined = (
        [m for m in fake_model.requests[i].messages if m["role"] == "tool"][-1]["content"] for i in range(1, 5))
    assert "HOUSE-STYLE-BODY" in read and "an example report" in example
    assert "leaves the skill folder" in escaped and "BEGIN" not in escaped
    assert "no skill" in inlined
    unmatched = daemon.cli("dispatch", "hello there", "--json")
    assert unmatched.returncode == 6, unmatched.stdout + unmatched.stderr
    assert daemon.stop() == 0
