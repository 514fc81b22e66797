"""The README's quick start: `make` installs without a deprecation warning; the demo prints each command it
runs so that it can be pasted (issue 16), branches on each ticket and ends with what ran, counted from the
audit log (issue 39 item 14)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT, traversable_tmpdir

_NOISE = re.compile(r"^WARNING: Location '.*' is ignored")  # this machine's pip index settings, not the build


def _install_args() -> list[str]:
    """The arguments of the Makefile's `pip install -e` line."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    line = next(line for line in makefile.splitlines() if "pip install" in line and " -e " in line)
    return shlex.split(line.split("pip install", 1)[1])


def test_the_makefile_install_line_gives_no_warning_and_a_plain_path_entry(tmp_path: Path) -> None:
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    args = ["." if a == ".[test]" else a for a in _install_args()]  # the dependencies are the same as ours
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"), "install", "--no-deps", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip() and not _NOISE.match(line)]
    assert not [line for line in said if re.search(r"warn|deprecat", line, re.I)], "\n".join(said)
    # A .pth that names the checkout: no import hook runs at every start of `covenant` (the
    # fast dispatch path, tests/daemon/test_dispatch_imports.py), and new modules are seen at once.
    (pth,) = (target / "lib").glob("python3*/site-packages/__editable__*.pth")
    assert pth.read_text().strip() == str(REPO_ROOT)
    shown = subprocess.run([str(target / "bin" / "python"), "-c", "import covenant; print(covenant.__file__)"],
                           capture_output=True, text=True, timeout=60)
    assert shown.stdout.strip() == str(REPO_ROOT / "covenant" / "__init__.py"), shown.stderr


# Logs each covenant command's arguments, then runs it. Before `audit verify` it also saves the whole
# audit log (checkpoints included) for the test, by its own `audit tail`: the demo's home is gone at its end.
_RECORDER = """#!{python}
import json, os, subprocess, sys
with open({log!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["audit", "verify"]:
    with open({audit!r}, "w") as f:
        subprocess.run([{covenant!r}, "audit", "tail", "--json", "--type", "*", "-n", "1000000"], stdout=f, check=True)
os.execv({covenant!r}, [{covenant!r}, *sys.argv[1:]])
"""


def _collapse(commands: list[list[str]]) -> list[list[str]]:
    """Consecutive repeats as one (the demo's readiness loop runs `status` until the daemon answers)."""
    return [c for i, c in enumerate(commands) if i == 0 or c != commands[i - 1]]


@dataclass(frozen=True)
class DemoRun:
    recorder: Path
    done: subprocess.CompletedProcess[str]
    ran: list[list[str]]
    """The covenant commands the demo ran, as the recorder saw them."""
    audit: list[dict[str, Any]]
    """The audit log as it was when the demo verified it."""


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory, built_examples: Path) -> DemoRun:
    """One run of scripts/demo.sh with stdout captured (not a terminal), through a covenant that records."""
    folder = tmp_path_factory.mktemp("demo")
    log, audit = folder / "ran.jsonl", folder / "audit.jsonl"
    recorder = folder / "covenant"
    recorder.write_text(_RECORDER.format(python=sys.executable, log=str(log), audit=str(audit),
                                         covenant=str(Path(sys.executable).with_name("covenant"))))
    recorder.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVENANT_", "XDG_"))}
    done = subprocess.run([str(REPO_ROOT / "scripts" / "demo.sh")], env={**env, "COVENANT": str(recorder)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [json.loads(line) for line in log.read_text().splitlines()]
    return DemoRun(recorder, done, ran, [json.loads(line) for line in audit.read_text().splitlines()])


def test_the_demo_prints_every_covenant_command_it_runs_quoted_for_pasting(demo_run: DemoRun) -> None:
    recorder, done = demo_run.recorder, demo_run.done
    # A pipeline's line ends the covenant command at its `|`.
    printed = [shlex.split(line[2:]) for line in done.stdout.splitlines() if line.startswith(f"$ {recorder} ")]
    printed = [argv[: argv.index("|")] if "|" in argv else argv for argv in printed]
    printed = [argv[1:-1] if argv[-1] == "&" else argv[1:] for argv in printed]
    ran = demo_run.ran
    # The daemon starts in the background: its record may land after the readiness loop's first tries.
    daemon = [argv for argv in printed if argv[0] == "daemon"]
    assert len(daemon) == 1 and [argv for argv in ran if argv[0] == "daemon"] == daemon
    assert _collapse([a for a in printed if a[0] != "daemon"]) == _collapse([a for a in ran if a[0] != "daemon"])
    assert f"$ {recorder} dispatch 'count the words in this sentence'" in done.stdout
    assert ["dispatch", "calculate (2 + 3) * 7"] in printed and ["audit", "verify"] in printed
    assert "\033[" not in done.stdout + done.stderr  # not a terminal: plain headings
    assert "\n== a fresh home" in done.stdout


def _children(audit: list[dict[str, Any]], parent: str) -> dict[str, str]:
    """step -> agent of each workflow step that ran for ``parent`` (a skipped step has no intent)."""
    received = {r["data"]["intent"]: r["data"] for r in audit if r["type"] == "intent.received"}
    ran = {r["data"]["intent"]: r["data"]["agent"] for r in audit if r["type"] == "intent.completed"}
    return {data["step"]: ran[intent] for intent, data in received.items()
            if data.get("parent") == parent and data.get("via") == "workflow" and intent in ran}


def test_the_demo_workflow_branches_on_each_ticket(demo_run: DemoRun) -> None:
    """The billing ticket runs the billing step, the technical one the technical step; never both, never neither."""
    audit = demo_run.audit
    tickets = [r["data"]["intent"] for r in audit if r["type"] == "policy.decision"
               and r["data"].get("agent") == "triage@local" and r["data"].get("depth", 0) == 0 and r["data"]["allowed"]
               and not any(x["type"] == "intent.received" and x["data"]["intent"] == r["data"]["intent"] and x["data"]["dry_run"]
                           for x in audit)]
    assert len(tickets) == 2, tickets
    billing, technical = (_children(audit, intent) for intent in tickets)
    assert billing == {"classify": "triage@local", "billing": "triage@local", "size": "wordcount@local"}, billing
    assert technical == {"classify": "triage@local", "technical": "search@local", "size": "wordcount@local"}, technical
    out = demo_run.done.stdout
    assert "classify_ticket says: billing. Next step: hand it to the billing team.\n(words: 12" in out
    assert re.search(r"^\d+ matching line\(s\) for memory limit", out, re.M)  # search@local answered the technical one
    tool_calls = [r["data"] for r in audit if r["type"] == "tool.call"]
    assert {c["name"] for c in tool_calls} == {"classify_ticket"} and all(c["outcome"] == "ok" for c in tool_calls)


def test_the_demo_ends_with_what_ran_counted_from_the_audit_log(demo_run: DemoRun) -> None:
    audit, out = demo_run.audit, demo_run.done.stdout
    last = out.rstrip("\n").splitlines()[-1]
    completed = [r["data"] for r in audit if r["type"] == "intent.completed"]
    agents = sorted({c["agent"] for c in completed})
    assert agents == ["calc@local", "search@local", "triage@local", "wordcount@local"]
    steps = sum(1 for r in audit if r["type"] == "intent.received" and r["data"].get("via") == "workflow")
    denied = sum(1 for r in audit if r["type"] == "policy.decision" and not r["data"]["allowed"])
    models = [r["data"]["model"] for r in audit if r["type"] == "model.call"]
    tools = sum(1 for r in audit if r["type"] == "tool.call")
    assert set(models) == {"covenant-stand-in-model"} and steps == 6 and denied == 1 and tools == 3  # classify twice, the billing step once
    assert last == (f"what ran: 4 agents ({', '.join(agents)}), {len(completed)} intents ({steps} of them workflow steps), "
                    f"{denied} denied; model covenant-stand-in-model: {len(models)} calls; {tools} tool calls; "
                    f"{len(audit)} audit records")
    verified = re.search(r"^ok: (\d+) records", out, re.M)
    assert verified and int(verified.group(1)) == len(audit)  # the records `audit verify` checked, every one counted


def test_the_demo_runs_for_a_user_who_is_not_root(built_examples: Path) -> None:
    """Most people who try the quick start are not root. The daemon then runs agents as its own uid,
    and the examples' network = "off" in a user namespace of their own (unshare -U -n), from inside
    which covenant's exec helper could not be executed: those examples crashed with exit 126."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("switching to an unprivileged user needs root and setpriv")
    nobody = 65534
    home = traversable_tmpdir()
    try:
        os.chown(home, nobody, nobody)
        env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
               "COVENANT": str(Path(sys.executable).with_name("covenant"))}
        done = subprocess.run(
            [setpriv, f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups", str(REPO_ROOT / "scripts" / "demo.sh")],
            env=env, capture_output=True, text=True, timeout=600,
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "isolation  same-uid" in done.stdout and "crashed" not in done.stdout
    assert "words: 7, lines: 1" in done.stdout  # wordcount@local, a network = "off" python3 agent, answered
    # The Rune agent's replica answered, from an empty network namespace; its process tool is not offered to a daemon
    # that cannot confine a tool's files (no agent uids), and the dry run says why. Without it the stand-in names
    # no category, so neither branch runs: each ticket's answer is its size note alone.
    assert len(re.findall(r"model\.call\s+agent=triage@local .* outcome=ok", done.stdout)) >= 2
    assert "classify_ticket says" not in done.stdout and done.stdout.count("\n(words: ") == 2
    assert "unavailable tool classify_ticket: its files cannot be confined on this host" in done.stdout
    assert re.search(r"^ok: \d+ records", done.stdout, re.M)  # audit verify
