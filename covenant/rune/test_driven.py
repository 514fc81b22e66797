"""The test-driven coding loop (``loop: test-driven``, a covenant extension of the Runefile).

The agent API's generate → execute → reflect → retry: each attempt asks the
model for code (the task, the test suite, and the previous attempt's code,
stdout and stderr), the daemon runs that code with the test suite in the
agent's sandbox and records the attempt (:mod:`covenant.tools.test_suite`,
:mod:`covenant.rune.trajectories`), and the loop stops once the tests pass
(the answer is the passing code) or after ``max_attempts`` (``tests_exhausted``).

The intent's text is the task, a JSON object (an A2A data part arrives as its
JSON text): ``task_description`` and ``test_suite`` (non-empty strings),
``task_type`` (default ``function``), ``max_attempts`` (1-20, default 3) and
``adapter_ids`` (strings; the first is sent to the provider). The daemon parses
the same text with :func:`parse_task` and believes its own reading, never the
replica's.

Stdlib and trio only: the replica imports this.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from covenant.rune.loop import LoopFailed, LoopResult, LoopSpec

__all__ = [
    "DEFAULT_ATTEMPTS",
    "MAX_ATTEMPTS",
    "CodingTask",
    "TaskError",
    "attempt_prompt",
    "extract_code",
    "parse_task",
    "run_test_driven",
]

MAX_ATTEMPTS = 20
DEFAULT_ATTEMPTS = 3
_MAX_ADAPTERS = 16
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_FEEDBACK_CHARS = 4000


class TaskError(ValueError):
    """The intent's text is not a coding task; the message names the field."""


@dataclass(frozen=True)
class CodingTask:
    task_description: str
    test_suite: str
    task_type: str = "function"
    max_attempts: int = DEFAULT_ATTEMPTS
    adapter_ids: tuple[str, ...] = ()

    @property
    def adapter(self) -> str | None:
        """The adapter sent to the provider: the first listed, as the agent API does."""
        return self.adapter_ids[0] if self.adapter_ids else None


def _text(document: dict[str, Any], name: str, default: str | None = None) -> str:
    value = document.get(name, default)
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{name} must be a non-empty string")
    return value


def parse_task(text: str) -> CodingTask:
    """The coding task in an intent's text; raise TaskError naming the bad field."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise TaskError(f"the input is not JSON ({exc}); send a JSON object with task_description and test_suite") from None
    if not isinstance(document, dict):
        raise TaskError("the input must be a JSON object with task_description and test_suite")
    unknown = sorted(set(document) - {"task_description", "test_suite", "task_type", "max_attempts", "adapter_ids"})
    if unknown:
        raise TaskError(f"unknown field(s): {', '.join(unknown)}")
    attempts = document.get("max_attempts", DEFAULT_ATTEMPTS)
    if type(attempts) is not int or not 1 <= attempts <= MAX_ATTEMPTS:
        raise TaskError(f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS}")
    adapters = document.get("adapter_ids", [])
    if (not isinstance(adapters, list) or len(adapters) > _MAX_ADAPTERS
            or not all(isinstance(a, str) and 0 < len(a) <= 128 for a in adapters)):
        raise TaskError(f"adapter_ids must be a list of at most {_MAX_ADAPTERS} non-empty strings (128 chars at most)")
    return CodingTask(
        task_description=_text(document, "task_description"),
        test_suite=_text(document, "test_suite"),
        task_type=_text(document, "task_type", "function"),
        max_attempts=attempts,
        adapter_ids=tuple(adapters),
    )


def extract_code(answer: str) -> str:
    """The code in a model's answer: its first fenced block, else the whole answer."""
    match = _FENCE.search(answer)
    return (match.group(1) if match else answer).strip("\n")


def _tail(text: str) -> str:
    return text if len(text) <= _FEEDBACK_CHARS else "…" + text[-_FEEDBACK_CHARS:]


def attempt_prompt(task: CodingTask, previous: dict[str, Any] | None) -> str:
    """The user message of one attempt: the task and tests, and what the last attempt's run printed."""
    parts = [
        f"Task ({task.task_type}): {task.task_description}",
        f"Your code will be run followed by this test suite (python3, unittest):\n```python\n{task.test_suite}\n```",
        "Answer with the complete code in one ```python block; do not repeat the tests.",
    ]
    if previous is not None:
        parts.append(
            f"Your previous attempt failed the tests (exit code {previous.get('exit_code')}).\n"
            f"Its code:\n```python\n{previous.get('generated_code', '')}\n```\n"
            f"stdout:\n{_tail(str(previous.get('stdout', '')))}\nstderr:\n{_tail(str(previous.get('stderr', '')))}\n"
            "Fix the code."
        )
    return "\n\n".join(parts)


class TestDrivenBackend(Protocol):
    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                   on_token: Callable[[str], Awaitable[None]] | None, *, adapter: str | None = None) -> dict[str, Any]:
        """One model turn (raise LoopFailed)."""

    async def attempt(self, generated_code: str) -> dict[str, Any]:
        """Run the code with the intent's test suite (the daemon's run and record); raise LoopFailed."""


async def run_test_driven(spec: LoopSpec, backend: TestDrivenBackend, text: str) -> LoopResult:
    """Generate, execute, reflect, retry until the tests pass or the attempts are spent.

    Raises LoopFailed ``agent_error`` for input that is no coding task, ``tests_exhausted`` when no attempt
    passed, and whatever the model or the daemon's run fail with.
    """
    try:
        task = parse_task(text)
    except TaskError as exc:
        raise LoopFailed("agent_error", f"loop: test-driven takes a coding task: {exc}") from None
    usage = {"input_tokens": 0, "output_tokens": 0}
    previous: dict[str, Any] | None = None
    for _ in range(task.max_attempts):
        messages = [{"role": "system", "content": spec.system_prompt},
                    {"role": "user", "content": attempt_prompt(task, previous)}]
        try:
            turn = await backend.chat(messages, [], None, adapter=task.adapter)
            for name in usage:
                usage[name] += int(turn.get(name) or 0)
            message = turn.get("message") if isinstance(turn.get("message"), dict) else {}
            code = extract_code(str(message.get("content") or ""))
            result = await backend.attempt(code)
        except LoopFailed as exc:
            exc.usage = usage
            raise
        if result.get("tests_passed") is True:
            return LoopResult(text=code, messages=[], usage=usage)
        previous = {**result, "generated_code": code}
    failed = LoopFailed("tests_exhausted",
                        f"no attempt passed the tests in {task.max_attempts} attempt(s); "
                        f"trajectory {previous.get('session_id') if previous else None}")
    failed.usage = usage
    raise failed
