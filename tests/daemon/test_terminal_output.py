"""Hostile: an agent's answer (or stderr) meant to act on the operator's terminal, not to be read.

The CLI prints agents' and models' text; raw, an escape sequence could clear the screen and draw a
fake result, set the clipboard or the window title, or a carriage return or a bidi override could
make a line read other than it is. Every such character is shown as a visible escape instead, on a
terminal and in a pipe alike; ``--json`` escapes them as JSON does.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import termios

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.fakes import FakeModelServer, Reply
from tests.rune.conftest import add_rune_agent, configure

ACTIVE = ("\x1b", "\x07", "\x9b", "\r", "\u202e", "\x00")


def on_a_terminal(d: DaemonProcess, *args: str) -> str:
    """``covenant ARGS`` with stdout on a pseudo-terminal (no output translation); all it wrote, stderr after.

    stderr stays a pipe: on a terminal ``covenant dispatch`` draws its own progress line there
    (``\r``, ``ESC[K``), the one sequence the CLI itself writes."""
    parent, child = pty.openpty()
    attrs = termios.tcgetattr(child)
    attrs[1] &= ~termios.OPOST  # keep "\n" as is: a "\r" in the output is the program's own
    termios.tcsetattr(child, termios.TCSANOW, attrs)
    proc = subprocess.Popen([sys.executable, "-m", "covenant", *args], env=d.env, stdin=subprocess.DEVNULL,
                            stdout=child, stderr=subprocess.PIPE)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # EIO: the program is gone and the terminal closed
            break
        if not chunk:
            break
        out += chunk
    err = proc.communicate(timeout=60)[1]
    os.close(parent)
    return (out + err).decode("utf-8", "replace")


def test_an_agents_escape_sequences_never_reach_the_terminal(daemon: DaemonProcess) -> None:
    daemon.add_agent("escapes", "escapes.py")
    daemon.start()
    shown = on_a_terminal(daemon, "dispatch", "say it", "--agent", "escapes@local")
    assert "answer" in shown and "outcome: ok" in shown, shown
    assert not [c for c in ACTIVE if c in shown], repr(shown)
    assert "\\x1b]52;c;ZXZpbA==\\x07" in shown and "\\u202e" in shown  # visible, not acted on

    intent = json.loads(daemon.cli("dispatch", "again", "--agent", "escapes@local", "--json", check=True).stdout)
    assert "\x1b]52" in intent["text"]  # --json keeps the text exact (JSON escapes it)
    for args in (("show", intent["intent_id"]), ("history",), ("logs",)):
        piped = daemon.cli(*args, check=True).stdout
        on_tty = on_a_terminal(daemon, *args)
        for out in (piped, on_tty):
            assert not [c for c in ACTIVE if c in out], (args, repr(out))
    assert "\\x1b]0;title\\x07" in daemon.cli("show", intent["intent_id"], check=True).stdout  # the stderr tail


def test_a_models_streamed_tokens_are_shown_not_acted_on(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    """Streamed text arrives in pieces; an escape sequence split across them is still shown, not acted on
    (the characters are escaped, wherever a piece ends)."""
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, toolset=())
    daemon.start()
    text = "streamed \x1b]52;c;ZXZpbA==\x07 then \x1b[2J cleared\rover \u202eevil"
    fake_model.script(Reply(text=text))
    shown = on_a_terminal(daemon, "dispatch", "talk", "--agent", "chat@local", "--stream")
    assert "streamed" in shown and not [c for c in ACTIVE if c in shown], repr(shown)
    assert "\\x1b]52;c;ZXZpbA==\\x07" in shown and "\\u202e" in shown
    fake_model.script(Reply(text=text))
    events = [json.loads(line) for line in daemon.cli("dispatch", "talk", "--agent", "chat@local", "--stream",
                                                      "--json", check=True).stdout.splitlines()]
    assert "".join(e["text"] for e in events if e["event"] == "token") == text  # exact in JSON lines
