"""Fixtures for the CLI tests: the daemon fixture of tests/daemon, and both ways into `covenant`."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401  (the fixture, shared)

__all__ = ["DaemonProcess", "Ran", "run_fast", "run_click", "COVENANT"]

COVENANT = Path(sys.executable).parent / "covenant"
# The click group alone, bypassing main()'s fast path: the reference the fast path must match.
_CLICK_ONLY = "import sys; from covenant.cli.group import cli; sys.argv[0] = 'covenant'; cli(prog_name='covenant')"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str
    modules: frozenset[str]  # every module the process imported (from -X importtime)


def _run(argv: list[str], env: dict[str, str], timeout: float) -> Ran:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    modules = set()
    stderr_lines = []
    for line in done.stderr.splitlines(keepends=True):
        if line.startswith("import time:"):
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                modules.add(name)
        else:
            stderr_lines.append(line)
    return Ran(done.returncode, done.stdout, "".join(stderr_lines), frozenset(modules))


def run_fast(env: dict[str, str], *args: str, timeout: float = 120) -> Ran:
    """The real `covenant` console script (the entry point, fast path included), under -X importtime."""
    return _run([sys.executable, "-X", "importtime", str(COVENANT), *args], env, timeout)


def run_click(env: dict[str, str], *args: str, timeout: float = 120) -> Ran:
    """The same arguments through the click group only (how every dispatch ran before the fast path)."""
    return _run([sys.executable, "-X", "importtime", "-c", _CLICK_ONLY, *args], env, timeout)
