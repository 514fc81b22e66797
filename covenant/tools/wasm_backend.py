"""Where ``runtime: wasm`` tools run: wasmtime under the replicas' interpreter, in the agent's sandbox.

The runner script (:mod:`covenant.tools.wasm_runner`) runs under ``[rune] python`` (default: the
daemon's own interpreter), the one replicas already run under and which agent uids must reach; wasmtime
must be importable there and readable by other uids (:mod:`covenant.tools.runner_python`). The answer
is either the command prefix and the folders a run must read, or why wasm tools are unavailable here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from covenant.config import Config
from covenant.tools.runner_python import RunnerCommand, import_problem, runner_command

__all__ = ["wasm_backend"]

RUNNER = str(Path(__file__).with_name("wasm_runner.py"))


def wasm_backend(config: Config) -> RunnerCommand | str:
    """This config's wasm backend, or why there is none (blocking the first time: it starts the interpreter)."""
    python = config.rune.python or sys.executable
    problem = import_problem(python, "wasmtime", "wasm tools run", "through")
    return problem if problem is not None else runner_command(python, RUNNER, "wasm runner")
