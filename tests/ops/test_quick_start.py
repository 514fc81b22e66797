"""The README's quick start: `make` installs without a deprecation warning, and the demo prints each
command it runs so that it can be pasted (issue 16)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

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


_RECORDER = """#!{python}
import json, os, sys
with open({log!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
os.execv({covenant!r}, [{covenant!r}, *sys.argv[1:]])
"""


def _collapse(commands: list[list[str]]) -> list[list[str]]:
    """Consecutive repeats as one (the demo's readiness loop runs `status` until the daemon answers)."""
    return [c for i, c in enumerate(commands) if i == 0 or c != commands[i - 1]]


def test_the_demo_prints_every_covenant_command_it_runs_quoted_for_pasting(tmp_path: Path, built_examples: Path) -> None:
    log = tmp_path / "ran.jsonl"
    recorder = tmp_path / "covenant"
    recorder.write_text(_RECORDER.format(python=sys.executable, log=str(log),
                                         covenant=str(Path(sys.executable).with_name("covenant"))))
    recorder.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVENANT_", "XDG_"))}
    done = subprocess.run([str(REPO_ROOT / "scripts" / "demo.sh")], env={**env, "COVENANT": str(recorder)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = [shlex.split(line[2:]) for line in done.stdout.splitlines() if line.startswith(f"$ {recorder} ")]
    printed = [argv[1:-1] if argv[-1] == "&" else argv[1:] for argv in printed]
    ran = [json.loads(line) for line in log.read_text().splitlines()]
    # The daemon starts in the background: its record may land after the readiness loop's first tries.
    daemon = [argv for argv in printed if argv[0] == "daemon"]
    assert len(daemon) == 1 and [argv for argv in ran if argv[0] == "daemon"] == daemon
    assert _collapse([a for a in printed if a[0] != "daemon"]) == _collapse([a for a in ran if a[0] != "daemon"])
    assert f"$ {recorder} dispatch 'count the words in this sentence'" in done.stdout
    assert ["dispatch", "calculate (2 + 3) * 7"] in printed and ["audit", "verify"] in printed


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
    # that cannot confine a tool's files (no agent uids), and the dry run says why.
    assert done.stdout.count("[stand-in model]") == 2 and "classify_ticket says" not in done.stdout
    assert "unavailable tool classify_ticket: its files cannot be confined on this host" in done.stdout
    assert re.search(r"^ok: \d+ records", done.stdout, re.M)  # audit verify
