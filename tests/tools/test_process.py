"""Process tools through the runner's tool mode: real python3 and node processes, real limits."""

from __future__ import annotations

import json
import os

import psutil
import pytest
import trio

from covenant.config import Config, RuntimeConfig
from covenant.home import Home
from covenant.manifest.runefile import load_rune_package
from covenant.runtime.runner import Runner
from covenant.tools import ToolHost

from ..conftest import EXAMPLES_DIR, require_tool, rune_examples
from .conftest import Tools, confined
from ..processes import alive


ECHO_PY = """\
import json, os, sys
args = json.load(sys.stdin)
json.dump({"got": args, "cwd": os.getcwd(), "home": os.environ.get("HOME"),
           "env": sorted(os.environ)}, sys.stdout)
"""

ECHO_JS = """\
let data = "";
process.stdin.on("data", (c) => (data += c));
process.stdin.on("end", () => {
  const args = JSON.parse(data);
  process.stdout.write(JSON.stringify({ got: args, runtime: "node" }));
});
"""


FILESYSTEM = "capabilities: [filesystem]\n"
"""A tool that writes its marks in the agent's workspace, its working directory (the only place it may)."""


@pytest.fixture
def tools(confined_tools: Tools) -> Tools:
    """Process tools run only where their files are confined: agent uids (root) and Landlock."""
    return confined_tools


def descriptor(name: str, module: str, extra: str = "") -> str:
    return f"name: {name}\nversion: 0.1.0\nruntime: process\nmodule: {module}\n{extra}"


def marked_processes(intent: str) -> list[int]:
    """Live processes whose COVENANT_INTENT_ID marks a tool run of ``intent``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("COVENANT_INTENT_ID", "").startswith(f"{intent}:tool:"):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


async def test_python_tool_round_trip_with_the_agent_environment(tools: Tools) -> None:
    agent = tools.package(
        "echoer", ["echo"], {"tools/echo.yaml": descriptor("echo", "tools/echo.py"), "tools/echo.py": ECHO_PY}
    )
    assert [t["function"]["name"] for t in tools.host.offered(agent)] == ["echo"]
    args = {"texts": ["a", "b"], "n": 1.5, "nested": {"ok": True}}
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.echo")), "echo", json.dumps(args))
    assert result.ok, result
    assert result.content["got"] == args
    assert result.content["cwd"] == str(agent.root)
    assert result.content["home"].startswith(str(tools.home.state_dir / "scratch"))
    # built from the allowlist, never inherited: no daemon variable reaches the tool
    assert set(result.content["env"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "TZ", "COVENANT_AGENT_ID", "COVENANT_INTENT_ID"}
    [event] = tools.audit.of("tool.call")
    assert event["outcome"] == "ok" and event["tool"] == "tool.echo" and event["attempts"] == 1


async def test_node_tool_round_trip(tools: Tools) -> None:
    require_tool("node")
    agent = tools.package(
        "noder", ["echo_js"], {"tools/echo_js.yaml": descriptor("echo_js", "tools/echo.js"), "tools/echo.js": ECHO_JS}
    )
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.echo_js")), "echo_js", {"x": [1, 2]})
    assert result.ok, result
    assert result.content == {"got": {"x": [1, 2]}, "runtime": "node"}


async def test_executable_tool_and_a_non_executable_one(tools: Tools) -> None:
    script = "#!/bin/sh\ncat >/dev/null\necho '{\"shell\": true}'\n"
    agent = tools.package(
        "sheller",
        ["run_sh", "plain"],
        {
            "tools/run_sh.yaml": descriptor("run_sh", "tools/run.sh"),
            "tools/run.sh": script,
            "tools/plain.yaml": descriptor("plain", "tools/plain.txt"),
            "tools/plain.txt": "not a program\n",
        },
    )
    assert [t["function"]["name"] for t in tools.host.offered(agent)] == ["run_sh"]
    [(entry, reason)] = tools.host.unavailable(agent)
    assert entry == "plain" and "not executable" in reason
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.run_sh", "tool.plain")), "run_sh", {})
    assert result.ok and result.content == {"shell": True}
    refused = await tools.host.call(tools.ctx(agent), "plain", {})
    assert refused.error_code == "unknown_tool"


async def test_corpus_sentiment_tool_runs_with_its_real_python(tools: Tools) -> None:
    agent = load_rune_package(rune_examples() / "custom-tool-python").to_agent_spec()
    assert agent.id == "sentiment-agent@local"
    [offered] = tools.host.offered(agent)
    assert offered["function"]["name"] == "analyse_sentiment"
    ctx = tools.ctx(agent, tools.grant("tool.analyse_sentiment"))
    texts = ["I love this, it is great", "This is terrible and awful", "It is a table"]
    result = await tools.host.call(ctx, "analyse_sentiment", json.dumps({"texts": texts}))
    assert result.ok, result
    assert result.content["count"] == 3
    assert [r["sentiment"] for r in result.content["results"]] == ["positive", "negative", "neutral"]
    [event] = tools.audit.of("tool.call")
    assert event["tool"] == "tool.analyse_sentiment" and event["outcome"] == "ok"
    assert "love" not in json.dumps(tools.audit.events)


async def test_a_sleeping_tool_is_killed_at_its_timeout_with_its_children(tools: Tools) -> None:
    sleeper = """\
    import json, subprocess, sys, time
    json.load(sys.stdin)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    open("child.pid", "w").write(str(child.pid))
    time.sleep(120)
    """
    agent = tools.package(
        "sleepy",
        ["nap"],
        {"tools/nap.yaml": descriptor("nap", "tools/nap.py", "timeout_ms: 3000\n" + FILESYSTEM), "tools/nap.py": sleeper},
    )
    pid_file = tools.workspace(agent) / "child.pid"
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.nap"), intent="nap-intent"), "nap", {})
    assert result.error_code == "tool_timeout", result
    child = int(pid_file.read_text())  # the escaped child existed before the timeout
    assert not alive(child)
    assert marked_processes("nap-intent") == []
    [event] = tools.audit.of("tool.call")
    assert event["outcome"] == "error" and event["error_code"] == "tool_timeout"


async def test_the_intent_deadline_cuts_a_tool_short(tools: Tools) -> None:
    agent = tools.package(
        "late",
        ["nap"],
        {
            "tools/nap.yaml": descriptor("nap", "tools/nap.py", "timeout_ms: 60000\n"),
            "tools/nap.py": "import time\ntime.sleep(120)\n",
        },
    )
    start = trio.current_time()
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.nap"), seconds=1.0, intent="late-intent"), "nap", {})
    assert result.error_code == "tool_timeout"
    # Never past the deadline by more than the kill ladder (SIGTERM grace) takes.
    assert trio.current_time() - start < 1.0 + tools.config.runtime.kill_grace_ms / 1000 + 5
    assert marked_processes("late-intent") == []


FLAKY = """\
import json, os, sys
args = json.load(sys.stdin)
path = args["counter"]
count = int(open(path).read()) if os.path.exists(path) else 0
open(path, "w").write(str(count + 1))
if count + 1 < args["succeed_on"]:
    sys.exit(3)
json.dump({"attempt": count + 1}, sys.stdout)
"""


async def test_retry_policy_retries_a_failed_tool(tools: Tools) -> None:
    agent = tools.package(
        "flaky",
        ["flaky"],
        {
            "tools/flaky.yaml": descriptor(
                "flaky", "tools/flaky.py", "retry_policy:\n  max_attempts: 3\n  backoff: fixed\n" + FILESYSTEM
            ),
            "tools/flaky.py": FLAKY,
        },
    )
    counter = tools.workspace(agent) / "count"
    ctx = tools.ctx(agent, tools.grant("tool.flaky"))
    result = await tools.host.call(ctx, "flaky", {"counter": "count", "succeed_on": 3})
    assert result.ok and result.content == {"attempt": 3}
    assert tools.audit.of("tool.call")[-1]["attempts"] == 3
    counter.unlink()
    failed = await tools.host.call(ctx, "flaky", {"counter": "count", "succeed_on": 9})
    assert failed.error_code == "tool_failed" and "exited with code 3" in failed.error_message
    assert counter.read_text() == "3"
    assert [e["attempts"] for e in tools.audit.of("tool.call")] == [3, 3]


async def test_retry_policy_on_limits_what_is_retried(tools: Tools) -> None:
    agent = tools.package(
        "picky",
        ["flaky"],
        {
            "tools/flaky.yaml": descriptor(
                "flaky", "tools/flaky.py",
                "retry_policy:\n  max_attempts: 3\n  backoff: none\n  on: [tool_timeout]\n" + FILESYSTEM,
            ),
            "tools/flaky.py": FLAKY,
        },
    )
    counter = tools.workspace(agent) / "count"
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.flaky")), "flaky", {"counter": "count", "succeed_on": 2})
    assert result.error_code == "tool_failed"
    assert counter.read_text() == "1"
    assert tools.audit.of("tool.call")[-1]["attempts"] == 1


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("print('not json')", "not a JSON document"),
        ("print('{\"a\": 1} {\"b\": 2}')", "more than one JSON document"),
        ("pass", "without writing a JSON document"),
        ("print('[NaN]')", "not a JSON document"),
    ],
)
async def test_bad_output_is_an_error_result(tools: Tools, body: str, expected: str) -> None:
    agent = tools.package(
        "badout", ["bad"], {"tools/bad.yaml": descriptor("bad", "tools/bad.py"), "tools/bad.py": body + "\n"}
    )
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.bad")), "bad", {})
    assert result.error_code == "tool_bad_output", result
    assert expected in result.error_message


async def test_input_and_output_schemas(tools: Tools) -> None:
    agent = tools.package(
        "schemed",
        ["strict"],
        {
            "tools/strict.yaml": descriptor(
                "strict", "tools/strict.py",
                "input_schema_ref: schemas/in.json\noutput_schema_ref: schemas/out.yaml\n" + FILESYSTEM,
            ),
            "tools/strict.py": "import json,sys\nargs=json.load(sys.stdin)\nopen('ran','w').write('x')\n"
            "json.dump({'n': args['n']} if args['n'] > 0 else {'wrong': 1}, sys.stdout)\n",
            "schemas/in.json": json.dumps(
                {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
            ),
            "schemas/out.yaml": "type: object\nrequired: [n]\n",
        },
    )
    counter = tools.workspace(agent) / "ran"
    [offered] = tools.host.offered(agent)
    assert offered["function"]["parameters"]["required"] == ["n"]
    ctx = tools.ctx(agent, tools.grant("tool.strict"))
    bad = await tools.host.call(ctx, "strict", {"n": "three"})
    assert bad.error_code == "invalid_arguments" and "at n" in bad.error_message
    assert not counter.exists()  # nothing ran
    good = await tools.host.call(ctx, "strict", {"n": 3})
    assert good.ok and good.content == {"n": 3}
    wrong = await tools.host.call(ctx, "strict", {"n": -1})
    assert wrong.error_code == "tool_bad_output" and "output schema" in wrong.error_message


async def test_a_missing_interpreter_makes_the_tool_unavailable(tools: Tools) -> None:
    agent = tools.package("nonode", ["js"], {"tools/js.yaml": descriptor("js", "tools/a.js"), "tools/a.js": ECHO_JS})
    runtime = RuntimeConfig(node="/nonexistent/node")
    async with Runner.open(runtime, scratch_root=tools.home.state_dir / "scratch2") as runner:
        host = ToolHost(tools.home, tools.config, runner, tools.audit)
        assert host.offered(agent) == []
        [(entry, reason)] = host.unavailable(agent)
        assert entry == "js" and "node" in reason
        result = await host.call(tools.ctx(agent, tools.grant("tool.js")), "js", {})
        assert result.error_code == "unknown_tool"


async def test_results_over_the_cap_and_floods_over_the_stdout_cap(tools: Tools) -> None:
    agent = tools.package(
        "chatty",
        ["big", "flood"],
        {
            "tools/big.yaml": descriptor("big", "tools/big.py"),
            "tools/big.py": "import json,sys\njson.load(sys.stdin)\njson.dump({'x': 'a' * 70000}, sys.stdout)\n",
            "tools/flood.yaml": descriptor("flood", "tools/flood.py"),
            "tools/flood.py": "import sys\nwhile True:\n    sys.stdout.write('a' * 65536)\n",
        },
    )
    ctx = tools.ctx(agent, tools.grant("tool.big", "tool.flood"), intent="flood-intent")
    big = await tools.host.call(ctx, "big", {})
    assert big.error_code == "result_too_large" and "65536" in big.error_message
    flood = await tools.host.call(ctx, "flood", {})
    assert flood.error_code == "tool_failed" and "stdout_cap_bytes" in flood.error_message
    assert marked_processes("flood-intent") == []


async def test_a_memory_hog_is_killed_at_its_resource_profiles_memory(home: Home) -> None:
    # A tool's process tree gets its agent's resource_profile memory ([rune] memory_small_mb here), not 512 MiB.
    async with confined(home, rune={"memory_small_mb": 64}) as tools:
        agent = tools.package(
            "hungry",
            ["hog"],
            {
                "tools/hog.yaml": descriptor("hog", "tools/hog.py", "timeout_ms: 20000\n"),
                "tools/hog.py": "import time\nblocks = []\nwhile True:\n    blocks.append(bytearray(8 << 20))\n    time.sleep(0.01)\n",
            },
        )
        assert agent.resource_profile == "small"
        result = await tools.host.call(tools.ctx(agent, tools.grant("tool.hog"), intent="hog-intent"), "hog", {})
        assert result.error_code == "tool_failed" and "memory_mb = 64" in result.error_message, result
        assert marked_processes("hog-intent") == []


async def test_a_cancelled_call_tears_the_tool_down_and_is_still_audited(tools: Tools) -> None:
    agent = tools.package(
        "doomed",
        ["nap"],
        {
            "tools/nap.yaml": descriptor("nap", "tools/nap.py", "timeout_ms: 60000\n" + FILESYSTEM),
            "tools/nap.py": "import time\nopen('started', 'w').write('x')\ntime.sleep(120)\n",
        },
    )
    started = tools.workspace(agent) / "started"
    ctx = tools.ctx(agent, tools.grant("tool.nap"), intent="doomed-intent")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tools.host.call, ctx, "nap", {})
        with trio.fail_after(30):
            while not started.exists():
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert marked_processes("doomed-intent") == []
    [event] = tools.audit.of("tool.call")
    assert event["outcome"] == "error" and event["error_code"] == "cancelled"


async def test_no_time_left_means_nothing_runs(tools: Tools) -> None:
    agent = tools.package(
        "expired",
        ["mark"],
        {"tools/mark.yaml": descriptor("mark", "tools/mark.py", FILESYSTEM), "tools/mark.py": "open('ran', 'w')\nprint('{}')\n"},
    )
    ran = tools.workspace(agent) / "ran"
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.mark"), seconds=-1), "mark", {})
    assert result.error_code == "tool_timeout" and not ran.exists()
    assert tools.audit.of("tool.call")[-1]["attempts"] == 0


COUNTING_PY = """\
import json, os, sys, time
folder = json.load(sys.stdin)["folder"]
os.makedirs(folder, exist_ok=True)
mine = os.path.join(folder, str(os.getpid()))
open(mine, "w").close()
seen = len(os.listdir(folder))
time.sleep(0.3)
seen = max(seen, len(os.listdir(folder)))
os.unlink(mine)
json.dump({"seen": seen}, sys.stdout)
"""


async def test_one_agent_runs_at_most_max_runs_per_agent_tools_at_once_and_the_rest_wait(tools: Tools) -> None:
    """A model turn may ask for many calls at once: all are run, a few at a time (``[tools] max_runs_per_agent``)."""
    tools.host.services.config = Config.model_validate({"tools": {"max_runs_per_agent": 3}})
    agent = tools.package(
        "counter", ["count"],
        {"tools/count.yaml": descriptor("count", "tools/count.py", FILESYSTEM), "tools/count.py": COUNTING_PY},
    )
    ctx = tools.ctx(agent, tools.grant("tool.count"))
    results = []

    async def one() -> None:
        results.append(await tools.host.call(ctx, "count", {"folder": "running"}))

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(one)
    assert [r.ok for r in results] == [True] * 12, [r for r in results if not r.ok]
    assert max(r.content["seen"] for r in results) <= 3, sorted(r.content["seen"] for r in results)


HOLDING_PY = """\
import json, os, sys, time
paths = json.load(sys.stdin)
open(paths["started"], "w").close()
while not os.path.exists(paths["release"]):
    time.sleep(0.02)
print("{}")
"""


async def test_a_call_queued_for_a_place_to_run_gets_its_whole_timeout_once_it_has_one(tools: Tools) -> None:
    """``timeout_ms`` counts from when a call got one of the agent's ``[tools] max_runs_per_agent`` places: a call
    queued behind a long one is not timed out by its wait (only the intent's own deadline bounds that)."""
    tools.host.services.config = Config.model_validate({"tools": {"max_runs_per_agent": 1}})
    agent = tools.package(
        "queued",
        ["hold", "quick"],
        {
            "tools/hold.yaml": descriptor("hold", "tools/hold.py", "timeout_ms: 60000\n" + FILESYSTEM),
            "tools/hold.py": HOLDING_PY,
            "tools/quick.yaml": descriptor("quick", "tools/quick.py", "timeout_ms: 3000\n"),
            "tools/quick.py": "print('{}')\n",
        },
    )
    started, release = tools.workspace(agent) / "started", tools.workspace(agent) / "release"
    grants = tools.grant("tool.hold", "tool.quick")
    results = {}

    async def call(key: str, name: str, arguments: dict[str, str], seconds: float = 60.0) -> None:
        results[key] = await tools.host.call(tools.ctx(agent, grants, seconds=seconds), name, arguments)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "hold", "hold", {"started": "started", "release": "release"})
        while not started.exists():
            await trio.sleep(0.02)
        nursery.start_soon(call, "quick", "quick", {})
        nursery.start_soon(call, "late", "quick", {}, 1.0)  # its intent ends while it waits
        await trio.sleep(4)  # longer than quick's timeout_ms, all of it spent waiting for the one place
        assert "quick" not in results, results["quick"]
        release.touch()
    assert results["hold"].ok and results["quick"].ok, results
    late = results["late"]
    assert late.error_code == "tool_timeout" and "the intent's time ran out" in late.error_message, late
    assert [e["attempts"] for e in tools.audit.of("tool.call")] == [1, 1, 1]


async def test_the_example_triage_tool_through_the_host(tools: Tools) -> None:
    agent = load_rune_package(EXAMPLES_DIR / "triage-rune").to_agent_spec()
    fetch, offered = tools.host.offered(agent)
    assert fetch["function"]["name"] == "web-fetch" and offered["function"]["name"] == "classify_ticket"
    assert offered["function"]["parameters"]["required"] == ["ticket"]
    assert tools.host.unavailable(agent) == []
    ctx = tools.ctx(agent, tools.grant("tool.classify_ticket"))
    billing = await tools.host.call(ctx, "classify_ticket", {"ticket": "I was charged twice"})
    assert billing.ok and billing.content == {"category": "billing"}
    missing = await tools.host.call(ctx, "classify_ticket", {"text": "x"})
    assert missing.error_code == "invalid_arguments"


async def test_a_schema_file_others_may_write_makes_the_tool_unavailable(tools: Tools) -> None:
    agent = tools.package(
        "loose",
        ["t"],
        {
            "tools/t.yaml": descriptor("t", "tools/t.py", "input_schema_ref: tools/t.json\n"),
            "tools/t.py": "print('{}')\n",
            "tools/t.json": '{"type": "object"}',
        },
    )
    os.chmod(agent.root / "tools" / "t.json", 0o666)
    assert tools.host.offered(agent) == []
    [(entry, reason)] = tools.host.unavailable(agent)
    assert entry == "t" and "writable by group or others" in reason


@pytest.mark.parametrize("depth", [65, 100_000])
async def test_a_deeply_nested_result_is_bad_output(tools: Tools, depth: int) -> None:
    agent = tools.package(
        f"deep{depth}",
        ["deep"],
        {
            "tools/deep.yaml": descriptor("deep", "tools/deep.py"),
            "tools/deep.py": f"import sys\nsys.stdout.write('[' * {depth} + ']' * {depth})\n",
        },
    )
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.deep")), "deep", {})
    assert result.error_code == "tool_bad_output", result


async def test_a_result_with_a_lone_surrogate_is_bad_output(tools: Tools) -> None:
    agent = tools.package(
        "surrogates",
        ["s"],
        {"tools/s.yaml": descriptor("s", "tools/s.py"), "tools/s.py": "print('{\"a\": \"\\\\ud800\"}')\n"},
    )
    result = await tools.host.call(tools.ctx(agent, tools.grant("tool.s")), "s", {})
    assert result.error_code == "tool_bad_output" and "Unicode" in result.error_message
