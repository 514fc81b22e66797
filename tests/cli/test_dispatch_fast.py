"""`covenant dispatch` through the click-free fast path: real processes, a real daemon.

Each case runs the real console script (whose main() takes the fast path) and,
where the output must not change, the click group alone with the same
arguments; both must print the same and exit the same. -X importtime tells
which path ran: the fast one never imports click.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.cli.conftest import COVENANT, DaemonProcess, Ran, run_click, run_fast

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def how_to_start(daemon: DaemonProcess) -> str:
    """The hint when no daemon answers: it repeats the home, here given by COVENANT_HOME (issue 39 item 12)."""
    return f"start it with `COVENANT_HOME={daemon.home} covenant daemon` or `systemctl start covenant`"


# What the fast path does without (issue 38, docs/performance.md): click; socket, which builds four IntEnums
# at import (the client takes _socket); covenant.home, whose Home NamedTuple has a string annotation that
# makes the first builtin compile() of the process (covenant.home_paths has the str functions); pathlib.
FAST_PATH_LEAVES_OUT = frozenset({"click", "socket", "covenant.home", "pathlib"})
# And a plain dispatch that succeeds (no --json, no --dry-run, no error hint) takes its JSON from covenant.json_fast:
# the json package imports re, and re enum, ≈ 26 million instructions together (issue 38).
PLAIN_DISPATCH_LEAVES_OUT = frozenset({"json", "re", "enum"})


def fast_and_click(env: dict[str, str], *args: str) -> tuple[Ran, Ran]:
    fast, slow = run_fast(env, *args), run_click(env, *args)
    assert not fast.modules & FAST_PATH_LEAVES_OUT, f"the fast path imported {fast.modules & FAST_PATH_LEAVES_OUT} for {args}"
    assert "click" in slow.modules
    return fast, slow


def same_output(fast: Ran, slow: Ran, normalise: bool = False) -> None:
    def norm(text: str) -> str:
        return UUID.sub("<uuid>", text) if normalise else text

    assert (fast.returncode, norm(fast.stdout), norm(fast.stderr)) == (slow.returncode, norm(slow.stdout),
                                                                       norm(slow.stderr))


def test_dispatch_prints_the_agent_text_like_the_click_path(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py")
    daemon.start()
    fast, slow = fast_and_click(daemon.env, "dispatch", "hello there", "--agent", "echo@local")
    assert fast.returncode == 0, fast.stderr
    assert fast.stdout == "hello there\n" and fast.stderr == ""
    assert not fast.modules & PLAIN_DISPATCH_LEAVES_OUT, fast.modules & PLAIN_DISPATCH_LEAVES_OUT
    same_output(fast, slow)
    # Options after TEXT, every option at once, and escape sequences shown, not acted on (tests/daemon/test_terminal_output.py).
    fast, slow = fast_and_click(daemon.env, "dispatch", "\x1b[31mred\x1b[0m", "--priority", "high",
                                "--parent", "p-1", "--agent", "echo@local")
    assert fast.returncode == 0 and fast.stdout == "\\x1b[31mred\\x1b[0m\n"
    same_output(fast, slow)


def test_json_output(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py")
    daemon.start()
    fast, slow = fast_and_click(daemon.env, "dispatch", "as json", "--agent", "echo@local", "--json")
    assert fast.returncode == slow.returncode == 0
    outcome, reference = json.loads(fast.stdout), json.loads(slow.stdout)
    assert outcome["outcome"] == "ok" and outcome["text"] == "as json" and outcome["exit_code"] == 0
    assert outcome.keys() == reference.keys()
    assert fast.stdout == json.dumps(outcome, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def test_dry_run_explains_and_spawns_nothing(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py", keywords=("echo",), required=("tool.echo",))
    daemon.start()
    denied_fast, denied_click = fast_and_click(daemon.env, "dispatch", "echo x", "--dry-run")
    assert denied_fast.returncode == 3
    same_output(denied_fast, denied_click, normalise=True)
    daemon.cli("grant", "tester@test", "tool.echo", check=True)
    fast, slow = fast_and_click(daemon.env, "dispatch", "echo x", "--dry-run")
    assert fast.returncode == 0, fast.stderr
    assert "would dispatch to echo@local" in fast.stdout
    same_output(fast, slow, normalise=True)
    assert daemon.api("GET", "/v1/dispatches?limit=10") == {"dispatches": []}


def test_error_answers_keep_their_message_and_exit_code(daemon: DaemonProcess) -> None:
    daemon.add_agent("echo", "echo.py")
    daemon.start()
    fast, slow = fast_and_click(daemon.env, "dispatch", "x", "--agent", "nope@local")
    assert fast.returncode == 6 and fast.stderr.startswith("covenant: error: ")
    same_output(fast, slow)


def test_home_option_before_dispatch(daemon: DaemonProcess, tmp_path: Path) -> None:
    daemon.add_agent("echo", "echo.py")
    daemon.start()
    env = {k: v for k, v in daemon.env.items() if k != "COVENANT_HOME"}
    fast = run_fast(env, "--home", str(daemon.home), "dispatch", "via home", "--agent", "echo@local")
    assert "click" not in fast.modules
    assert (fast.returncode, fast.stdout) == (0, "via home\n"), fast.stderr
    # Without COVENANT_SOCKET the socket is <home>/run/covenant.sock: --home decides where the CLI looks.
    other = tmp_path / "other-home"
    env.pop("COVENANT_SOCKET")
    fast, slow = fast_and_click(env, "--home", str(other), "dispatch", "hi")
    assert fast.returncode == 5
    assert f"no one listens on {other / 'run' / 'covenant.sock'}" in fast.stderr
    assert f"start it with `covenant --home {other} daemon`" in fast.stderr  # pasted, it starts that home's daemon
    same_output(fast, slow)


def test_daemon_absent_says_how_to_start_it(daemon: DaemonProcess) -> None:
    fast, slow = fast_and_click(daemon.env, "dispatch", "anyone there?")
    assert fast.returncode == 5
    assert fast.stderr.startswith("covenant: error: the daemon is not running") and how_to_start(daemon) in fast.stderr
    assert fast.stdout == ""
    same_output(fast, slow)


def test_first_use_creates_an_identity_with_a_note(daemon: DaemonProcess, tmp_path: Path) -> None:
    outputs = []
    for path, run in (("fast", run_fast), ("click", run_click)):
        env = {**daemon.env, "XDG_CONFIG_HOME": str(tmp_path / f"xdg-{path}")}
        ran = run(env, "dispatch", "hello")
        assert ran.returncode == 5
        assert ran.stderr.startswith("covenant: created your identity tester@")
        assert (tmp_path / f"xdg-{path}" / "covenant" / "identity.key").exists()
        outputs.append(re.sub(r"\([0-9a-f]{64}\)", "(<pubkey>)", ran.stderr))
    assert outputs[0] == outputs[1]


def test_fallbacks_go_through_click(daemon: DaemonProcess) -> None:
    env = daemon.env
    cases = [
        (("dispatch", "--help"), 0, "Usage: covenant dispatch [OPTIONS] TEXT"),
        (("dispatch", "-h", "hi"), 0, "Usage: covenant dispatch [OPTIONS] TEXT"),  # -h is --help everywhere
        (("dispatch", "--verbose", "hi"), 2, "No such option '--verbose'"),
        (("dispatch", "--priority", "bogus", "hi"), 2, "Invalid value for '--priority': 'bogus' is not one of"),
        (("dispatch",), 2, "Missing argument 'TEXT'"),
        (("dispatch", "--agent"), 2, "Option '--agent' requires an argument"),
        (("dispatch", "one", "two"), 2, "Got unexpected extra argument (two)"),
        (("--home",), 2, "Option '--home' requires an argument"),
    ]
    for args, code, text in cases:
        ran = run_fast(env, *args)
        assert "click" in ran.modules, args
        assert ran.returncode == code, (args, ran.stdout, ran.stderr)
        assert text in ran.stdout + ran.stderr, (args, ran.stdout, ran.stderr)
    # Forms the fast parser leaves to click still dispatch normally (daemon absent here: exit 5).
    for args in (("dispatch", "--agent=x", "hi"), ("dispatch", "--", "hi"), ("--home=" + str(daemon.home), "dispatch", "hi")):
        ran = run_fast(env, *args)
        assert "click" in ran.modules and ran.returncode == 5 and how_to_start(daemon) in ran.stderr, args


def test_spinner_on_a_terminal(daemon: DaemonProcess) -> None:
    """With stderr on a terminal the fast path shows the agent's name and elapsed time while waiting."""
    daemon.add_agent("slow", "slow.py")
    daemon.start()
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen([str(COVENANT), "dispatch", "sleep 1.5", "--agent", "slow@local"], env=daemon.env,
                                   stdout=subprocess.PIPE, stderr=terminal, text=True)
        os.close(terminal)
        seen = b""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:  # the terminal's last writer exited
                    break
                if not chunk:
                    break
                seen += chunk
            elif process.poll() is not None:
                break
        stdout, _ = process.communicate(timeout=120)
    finally:
        os.close(controller)
    assert process.returncode == 0
    assert stdout == "slept 1.5\n"
    assert re.search(rb"[|/\\-] slow@local +\d+\.\ds", seen), seen
    assert seen.endswith(b"\r\x1b[K"), seen  # the spinner line is cleared before the answer


def test_python_m_covenant_takes_the_fast_path_too(daemon: DaemonProcess) -> None:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "covenant", "dispatch", "hi"], env=daemon.env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 5
    assert not re.search(r"\| +click$", done.stderr, re.MULTILINE)
