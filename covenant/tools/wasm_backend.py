"""Where ``runtime: wasm`` tools run: wasmtime under the replicas' interpreter, in the agent's sandbox.

The runner script (:mod:`covenant.tools.wasm_runner`) runs under ``[rune] python`` (default: the
daemon's own interpreter), the one replicas already run under and which agent uids must reach; wasmtime
must be importable there and readable by other uids. Judged once per interpreter while the process
lives (it starts that interpreter once); the answer is either the command prefix and the folders a run
must read, or why wasm tools are unavailable here.
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from covenant.config import Config
from covenant.runtime.tool_files import interpreter_roots

__all__ = ["WasmBackend", "closed_to_others", "wasm_backend"]

RUNNER = str(Path(__file__).with_name("wasm_runner.py"))
_PROBE = "import os, wasmtime; print(os.path.dirname(wasmtime.__file__))"


@dataclass(frozen=True)
class WasmBackend:
    prefix: tuple[str, ...]
    """``python -I wasm_runner.py``: the module and its settings follow."""
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


@functools.lru_cache(maxsize=8)
def _judge(python: str) -> WasmBackend | str:
    try:
        probe = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"wasm tools run under [rune] python ({python}), which cannot be started: {exc}"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return (f"wasm tools run through wasmtime under [rune] python ({python}), which cannot import it ({last}); "
                f"install it there: {python} -m pip install wasmtime")
    folder = probe.stdout.strip()
    closed = closed_to_others(folder) or closed_to_others(RUNNER)
    if closed is not None:
        return f"wasmtime ({folder}) or covenant's wasm runner is not readable by agent uids: {closed} is closed to them"
    return WasmBackend((python, "-I", RUNNER), (*interpreter_roots(python), RUNNER))


def wasm_backend(config: Config) -> WasmBackend | str:
    """This config's wasm backend, or why there is none (blocking the first time: it starts the interpreter)."""
    return _judge(config.rune.python or sys.executable)
