"""The daemon's side of the test-driven loop: each attempt run as the agent, recorded, and believed only here.

A replica with ``loop: test-driven`` (:mod:`covenant.rune.test_driven`) sends
the code of each attempt to ``POST /v1/attempt`` on its gateway. The daemon
reads the task from the intent's own text (never from the replica), runs the
code with the task's test suite in the agent's sandbox
(:mod:`covenant.tools.test_suite`), appends the attempt to the intent's
trajectory (:mod:`covenant.rune.trajectories`; the session id is a UUID4 made
here) and, once the tests pass or ``max_attempts`` is reached, its end. An
attempt past ``max_attempts`` is refused.

The replica's word decides nothing: :func:`checked_outcome` turns an ``ok``
without a passing attempt, or a ``tests_exhausted`` without the attempts spent,
into ``protocol_error``; the answer of an ``ok`` is the code the daemon ran.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

import trio

from covenant.clock import iso_now
from covenant.daemon.intent_context import IntentContext
from covenant.daemon.replica_gateway import GatewayRefused
from covenant.rune.test_driven import CodingTask, TaskError, parse_task
from covenant.rune.trajectories import (
    ATTEMPT_FIELDS,
    TrajectoryStore,
    new_trajectory_id,
)
from covenant.tools.host import ToolHost
from covenant.tools.test_suite import run_attempt

__all__ = ["MAX_CODE_BYTES", "TestAttempts", "checked_outcome"]

MAX_CODE_BYTES = 256 * 1024
"""The most generated code one attempt may send."""

log = logging.getLogger("covenant.rune")

_STATE = "test_driven"


@dataclass
class _Trajectory:
    """One intent's run of the loop, as the daemon saw it."""

    task: CodingTask
    session_id: str = field(default_factory=new_trajectory_id)
    attempts: int = 0
    passed_code: str | None = None
    ended: str | None = None
    """``success`` or ``exhausted`` once the end is recorded."""


def _trajectory(intent: IntentContext) -> _Trajectory:
    """The intent's trajectory, its task read from the intent's text at the first call; GatewayRefused when the
    agent is not test-driven or the text is no coding task."""
    held = intent.state.get(_STATE)
    if held is not None:
        return held
    if intent.package.runefile.loop != "test-driven":
        raise GatewayRefused("bad_request", f"{intent.agent.id} is not a loop: test-driven agent", 403)
    try:
        task = parse_task(intent.text)
    except TaskError as exc:
        raise GatewayRefused("agent_error", f"the intent's text is no coding task: {exc}", 400) from None
    held = intent.state[_STATE] = _Trajectory(task)
    return held


class TestAttempts:
    """Runs and records the attempts of test-driven intents for one daemon."""

    def __init__(self, tools: ToolHost) -> None:
        self.tools = tools

    @property
    def store(self) -> TrajectoryStore:
        return TrajectoryStore(self.tools.services.home.state_dir / "trajectories")

    def adapter(self, intent: IntentContext, adapter: Any) -> str:
        """``adapter`` when the intent's task lists it (the model is asked through it); GatewayRefused otherwise."""
        if not isinstance(adapter, str) or adapter not in _trajectory(intent).task.adapter_ids:
            raise GatewayRefused("bad_request", f"adapter {adapter!r} is not one of the intent's adapter_ids", 400)
        return adapter

    async def attempt(self, intent: IntentContext, body: dict[str, Any]) -> dict[str, Any]:
        """Run one attempt and record it: the execute fields, ``session_id``, ``attempt``, ``max_attempts`` and
        ``outcome`` (null while attempts remain)."""
        trajectory = _trajectory(intent)
        code = body.get("generated_code")
        if not isinstance(code, str) or len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise GatewayRefused("bad_request", f"generated_code must be a string of at most {MAX_CODE_BYTES} bytes", 400)
        task = trajectory.task
        if trajectory.ended is not None:
            raise GatewayRefused("tests_exhausted", f"the trajectory {trajectory.session_id} has ended ({trajectory.ended})", 409)
        trajectory.attempts += 1
        number = trajectory.attempts
        run_id = f"{intent.intent_id}:attempt:{number}:{secrets.token_hex(4)}"
        result = await run_attempt(self.tools.services, intent.agent, run_id, code, task.test_suite, intent.deadline,
                                   intent.priority)
        if result.tests_passed:
            trajectory.passed_code = code
        record = {
            "kind": "attempt", "session_id": trajectory.session_id, "attempt": number,
            "agent": intent.agent.id, "intent": intent.intent_id, "generated_code": code,
            **{name: value for name, value in result.to_json().items() if name in ATTEMPT_FIELDS},
            "task_description": task.task_description, "task_type": task.task_type,
            "adapter_ids": list(task.adapter_ids), "ts": iso_now(),
        }
        end = "success" if result.tests_passed else "exhausted" if number >= task.max_attempts else None
        await self._append(intent, trajectory, record)
        if end is not None:
            await self._append(intent, trajectory, {"kind": "end", "session_id": trajectory.session_id,
                                                     "outcome": end, "attempts": number, "ts": iso_now()})
            trajectory.ended = end
        return {**result.to_json(), "session_id": trajectory.session_id, "attempt": number,
                "max_attempts": task.max_attempts, "outcome": end}

    async def _append(self, intent: IntentContext, trajectory: _Trajectory, record: dict[str, Any]) -> None:
        store = self.store
        try:
            await trio.to_thread.run_sync(store.append, intent.agent.id, trajectory.session_id, record)
        except OSError as exc:  # disk full: the loop cannot keep its record, so it stops
            log.error("cannot append to a trajectory", extra={"agent": intent.agent.id, "session": trajectory.session_id,
                                                               "error": str(exc)})
            raise GatewayRefused("crashed", f"trajectory {trajectory.session_id} cannot be written: {exc}", 500) from None


def checked_outcome(intent: IntentContext, outcome: str, text: str | None) -> tuple[str, str | None, str | None]:
    """(outcome, error, answer) of a test-driven intent as the daemon's own attempts bear it out; ``error`` is
    None when the replica's outcome stands. Other agents' outcomes pass through."""
    if intent.package.runefile.loop != "test-driven":
        return outcome, None, text
    trajectory: _Trajectory | None = intent.state.get(_STATE)
    if outcome == "ok":
        if trajectory is None or trajectory.passed_code is None:
            return "protocol_error", "the replica answered ok, but no attempt the daemon ran passed the tests", None
        return "ok", None, trajectory.passed_code
    if outcome == "tests_exhausted" and (trajectory is None or trajectory.ended != "exhausted"):
        return "protocol_error", "the replica answered tests_exhausted before its attempts were spent", None
    return outcome, None, text
