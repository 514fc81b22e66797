"""Runner scripts that tools run under the replicas' interpreter, in the agent's sandbox.

Wasm and media tools run a script of covenant's (:mod:`covenant.tools.wasm_runner`,
:mod:`covenant.tools.media_runner`) under ``[rune] python`` (default: the daemon's own interpreter),
as the agent's uid through the tool runner. What such a script and the packages it imports need is the
same for both: readable by other uids, and importable there. Each answer is judged once per
interpreter while the process lives (probing starts that interpreter).
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from covenant.runtime.tool_files import interpreter_roots

__all__ = ["RunnerCommand", "closed_to_others", "import_problem", "runner_command"]


@dataclass(frozen=True)
class RunnerCommand:
    prefix: tuple[str, ...]
    """``python -I RUNNER``: what the run is given follows."""
    read_only: tuple[str, ...]
    """Beyond the package: the interpreter's prefix (a venv) and the runner script, for the run's Landlock rules."""


def closed_to_others(path: str) -> str | None:
    """The first folder on ``path`` other uids cannot enter, or ``path`` itself when they cannot read it; None."""
    current = Path(path)
    for folder in [current, *current.parents]:
        try:
            mode = os.stat(folder).st_mode
        except OSError:
            return str(folder)
        if folder != current:
            needed = stat.S_IXOTH
        else:  # the last: read (and a folder entered)
            needed = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & needed != needed:
            return str(folder)
    return None


@functools.lru_cache(maxsize=16)
def runner_command(python: str, runner: str, what: str) -> RunnerCommand | str:
    """``python -I runner`` and what a run of it reads, or why agent uids cannot run ``what`` (the runner's name)."""
    closed = closed_to_others(runner)
    if closed is not None:
        return f"covenant's {what} is not readable by agent uids: {closed} is closed to them"
    return RunnerCommand((python, "-I", runner), (*interpreter_roots(python), runner))


@functools.lru_cache(maxsize=16)
def import_problem(python: str, package: str, doing: str, how: str) -> str | None:
    """Why ``package`` cannot be used by agent uids under ``python`` (not importable, or closed to them), or None.

    ``doing`` and ``how`` word the reason: "{doing} under [rune] python …", "{doing} {how} {package} under …".
    Blocking: it starts the interpreter (once per answer).
    """
    probe_code = f"import os, {package}; print(os.path.dirname({package}.__file__))"
    try:
        probe = subprocess.run([python, "-I", "-c", probe_code], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{doing} under [rune] python ({python}), which cannot be started: {exc}"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return (f"{doing} {how} {package} under [rune] python ({python}), which cannot import it ({last}); "
                f"install it there: {python} -m pip install {package}")
    folder = probe.stdout.strip()
    closed = closed_to_others(folder)
    if closed is not None:
        return f"{package} ({folder}) is not readable by agent uids: {closed} is closed to them"
    return None
