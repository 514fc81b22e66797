"""One attempt of the test-driven loop: the model's code and the task's test suite, run as the agent.

The daemon runs it, never the replica: ``[runtime] python3 -I -`` with the
script (generated code, a blank line, the test suite, and ``unittest.main()``
when the suite defines TestCase classes but never calls it) on stdin, through
the runner's tool mode exactly like ``rune@shell-exec``: the agent's uid, its
memory, disk and process limits, no network, its workspace as the working
directory (the only place it may write where the host confines tool files), its
process group killed at the end. Each attempt gets ``[tools.shell_exec]
timeout_ms``, never past the intent's remaining time, and one of the agent's
``[tools] max_runs_per_agent`` places.

What the agent API reports of an attempt is judged here, from what the runner
observed: ``tests_passed`` only when the suite defines tests, unittest says it
ran at least one, and the script exited 0 within its limits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

import trio

from covenant.manifest.model import AgentSpec
from covenant.runtime.tool_files import ToolFiles
from covenant.runtime.toolrun import ToolRun
from covenant.tools.services import ToolServices

__all__ = ["AttemptResult", "build_script", "count_tests", "has_unittest_classes", "judge", "run_attempt"]

_TEST_CASE = re.compile(r"^\s*class\s+\w+\s*\([^)]*TestCase[^)]*\)\s*:", re.MULTILINE)
_MAIN_CALL = re.compile(r"unittest\.main\s*\(")
_RAN = re.compile(r"^Ran (\d+) tests? in ", re.MULTILINE)
_FAILED = re.compile(r"^FAILED \(([^)]*)\)", re.MULTILINE)
_MAIN = "\n\nimport unittest\nif __name__ == '__main__':\n    unittest.main()\n"


@dataclass(frozen=True)
class AttemptResult:
    """The agent API's execute-node fields of one attempt."""

    stdout: str
    stderr: str
    exit_code: int
    tests_passed: bool
    test_count: int
    tests_ran: bool
    stopped: str | None = None
    """The limit that stopped the run (``timeout``, ``memory_exceeded``, …), or None."""

    def to_json(self) -> dict[str, Any]:
        return {"stdout": self.stdout, "stderr": self.stderr, "exit_code": self.exit_code,
                "tests_passed": self.tests_passed, "test_count": self.test_count, "tests_ran": self.tests_ran,
                "stopped": self.stopped}


def has_unittest_classes(script: str) -> bool:
    return bool(_TEST_CASE.search(script))


def build_script(code: str, test_suite: str) -> str:
    script = f"{code}\n\n{test_suite}"
    if has_unittest_classes(script) and not _MAIN_CALL.search(script):
        script += _MAIN
    return script


def count_tests(stderr: str) -> int:
    """How many tests unittest says it ran (its ``Ran N tests`` line; the last one wins)."""
    found = _RAN.findall(stderr)
    return int(found[-1]) if found else 0


def judge(code: str, test_suite: str, exit_code: int, stopped: str | None, stdout: str, stderr: str) -> AttemptResult:
    """The attempt's verdict from the run's observed ending (pure)."""
    test_count = count_tests(stderr)
    tests_ran = test_count > 0
    passed = has_unittest_classes(f"{code}\n{test_suite}") and tests_ran and exit_code == 0 and stopped is None
    return AttemptResult(stdout, stderr, exit_code, passed, test_count, tests_ran, stopped)


def _cut(data: bytes, limit: int, keep_end: bool) -> str:
    if len(data) > limit:
        data = data[-limit:] if keep_end else data[:limit]
    return data.decode("utf-8", "replace")


def _exit_code(run: ToolRun) -> int:
    """The process's exit code; a signal as the shell reports it (128 + N); -1 when it never ran or was cut."""
    if run.exit_code is not None:
        return run.exit_code
    if run.signal is not None:
        return 128 + run.signal
    return -1


_STOPPED = {"timeout", "cpu_exceeded", "memory_exceeded", "disk_exceeded", "output_too_large", "spawn_failed",
            "cancelled"}


async def run_attempt(services: ToolServices, agent: AgentSpec, run_id: str, code: str, test_suite: str,
                      ends: float, priority: str) -> AttemptResult:
    """Run ``code`` with ``test_suite`` once as ``agent`` (see the module docstring); ``ends`` is the intent's
    deadline (trio time). Never raises for a fault of the code."""
    config = services.config
    left_ms = (ends - trio.current_time()) * 1000 if math.isfinite(ends) else math.inf
    wall_ms = int(min(config.tools.shell_exec.timeout_ms, left_ms))
    if wall_ms <= 0:
        return AttemptResult("", "the intent has no time left to run the tests", -1, False, 0, False, "timeout")
    workspace = await trio.to_thread.run_sync(services.workspace, agent.id)
    root = str(workspace.root)
    files = services.runner.tool_confinement.where_possible(ToolFiles(read_write=(root,)))
    script = build_script(code, test_suite).encode("utf-8", "surrogatepass")
    async with services.run_slot(agent.id):
        run = await services.runner.run_tool(
            agent, (config.runtime.python3, "-I", "-"), script, run_id=run_id, wall_ms=wall_ms,
            network="off", cwd=root, files=files, priority=priority,
        )
    limit = config.tools.shell_exec.output_max_bytes
    stopped = run.outcome if run.outcome in _STOPPED else None
    # Counted on the whole stderr tail: unittest's summary comes last and the cut keeps the end anyway.
    verdict = judge(code, test_suite, _exit_code(run), stopped, "", run.stderr_tail)
    stderr = _cut(run.stderr_tail.encode("utf-8", "replace"), limit, keep_end=True)
    if stopped is not None and run.error:
        stderr = f"{stderr}\n[covenant: the run was stopped ({stopped}): {run.error}]".lstrip("\n")
    return replace(verdict, stdout=_cut(run.stdout, limit, keep_end=False), stderr=stderr)
