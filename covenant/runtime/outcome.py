"""What one supervised run ended as: the outcome vocabulary and the dispatch record.

The record is what covenant keeps of every run ("trajectory"): it is stored
append-only by :mod:`covenant.runtime.records`, shown by ``covenant history``
and ``covenant show``, and copied into the audit log. It holds integers only,
never floats: the audit log's canonical JSON forbids them.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from covenant.clock import iso_now
from covenant.errors import ExitCode

__all__ = ["Outcome", "OUTCOMES", "outcome_exit_code", "Cleanup", "DispatchRecord"]

Outcome = Literal[
    "ok",
    "agent_error",
    "timeout",
    "cpu_exceeded",
    "memory_exceeded",
    "disk_exceeded",
    "output_too_large",
    "protocol_error",
    "no_result",
    "crashed",
    "spawn_failed",
    "workflow_not_supported",
    "cancelled",
    # across agents (docs/workflows.md)
    "step_failed",
    # hosted Rune agents (design/rune-host.md)
    "token_budget_exceeded",
    "max_steps_exceeded",
    "provider_error",
    "provider_unavailable",
    "session_corrupt",
    "session_forbidden",
    "session_suspicious",
    "unsafe_output",
    # a loop: test-driven agent whose attempts never passed the tests (docs/rune-packages.md)
    "tests_exhausted",
    # the daemon died while the intent was in flight (recorded at its next start: docs/audit.md)
    "interrupted",
]

OUTCOMES: tuple[str, ...] = Outcome.__args__  # type: ignore[attr-defined]


def outcome_exit_code(outcome: Outcome) -> int:
    """Exit code of ``covenant run``/``dispatch`` for an outcome (DESIGN.md §7).

    ``ok`` 0, ``agent_error`` 1 (the agent answered ``status: error``),
    ``cancelled`` 5 (the daemon is shutting down), ``session_forbidden`` 3 (the
    session belongs to another issuer), every failure of the agent 4 (for Rune
    agents also ``token_budget_exceeded``, ``max_steps_exceeded``,
    ``provider_error``, ``provider_unavailable``, ``session_corrupt``, ``session_suspicious``,
    ``unsafe_output``, ``tests_exhausted``; and
    ``interrupted``, which only a record written at the next start carries).
    """
    if outcome == "ok":
        return ExitCode.OK
    if outcome == "agent_error":
        return ExitCode.AGENT_ERROR
    if outcome == "session_forbidden":
        return ExitCode.DENIED
    if outcome == "cancelled":
        return ExitCode.UNREACHABLE
    return ExitCode.AGENT_FAILED


class Cleanup(BaseModel):
    """Whether what the run left (its scratch dir; as its uid's last run, the uid's /tmp and /dev/shm) was all
    removed; ``reason`` names the first entry left and why when not (docs/runtime.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    complete: bool = True
    reason: str | None = None


class DispatchRecord(BaseModel):
    """One run of one agent for one intent, as covenant observed it.

    Times are ISO-8601 UTC with milliseconds (``2025-01-31T12:00:00.123Z``).
    ``error`` is a sentence for an operator (which limit, the first bytes of
    bad output); ``None`` when the outcome is ``ok`` or ``agent_error``.
    ``signal`` is set when the agent's root process was killed by a signal.
    """

    model_config = ConfigDict(extra="forbid")

    intent_id: str
    agent_id: str
    agent_version: str
    runtime: str
    argv: list[str]
    limits: dict[str, Any]
    pid: int | None
    started_at: str
    ended_at: str
    exit_code: int | None
    signal: int | None
    outcome: Outcome
    error: str | None
    duration_ms: int
    cpu_ms: int
    peak_rss_kib: int
    stdout_bytes: int
    scratch_peak_bytes: int
    stderr_tail: str
    result: dict[str, Any] | None
    network_enforced: bool
    left_behind: int = 0
    """Processes of the run covenant found still alive after the agent's own process had ended (a background
    child, an escape from the process group) and killed; with ``isolation: uid`` also those still running as
    the agent's uid when this was its last run in flight (docs/runtime.md, "Teardown")."""
    stderr_unlogged_bytes: int = 0
    """stderr bytes past the run's log budget, not logged (``stderr_tail`` still ends with the last ones;
    docs/runtime.md, "stderr and the log")."""
    session_id: str | None = None
    """Rune agents: the session the intent ran in."""
    usage: dict[str, int] | None = None
    """Rune agents: tokens, model calls, tool calls and steps of the intent."""
    isolation: Literal["uid", "same-uid"] = "same-uid"
    """``uid``: the agent ran as an unprivileged uid of its own; ``same-uid``: as covenant's (docs/security.md)."""
    uid: int | None = None
    """The uid the agent ran as when ``isolation`` is ``uid``."""
    parent: str | None = None
    """A child intent (agent tool, ``rune@agent-send``, workflow step): the intent that made it."""
    children: list[dict[str, Any]] = []
    """The child intents this one made, in start order: ``{intent, agent, outcome, started_at, duration_ms}``
    (``step`` for a workflow step); a refused child has its refusal reason as outcome."""
    peer_uid: int | None = None
    """uid of the local client (SO_PEERCRED) that submitted the dispatch; it may read this record.
    None for `covenant run` and for records written before it was kept."""
    cleanup: Cleanup = Field(default_factory=Cleanup)
    """Was everything the run left removed (any depth, never through a link, with the agent uid's rights)?"""
    artifacts: list[dict[str, Any]] = []
    """Files the intent's tools handed back (rune@canvas-present), oldest first:
    ``{name, media_type, bytes, sha256}``; the bytes are the daemon's (``covenant show ID --save DIR``)."""

    @classmethod
    def without_process(cls, *, t0: float, **fields: Any) -> DispatchRecord:
        """A record with no agent process measured: one hosted by the daemon (a Rune or workflow intent),
        or one whose agent never started (a failed spawn, a cancel while queued). ``t0`` is its
        :func:`time.monotonic` start; ``fields`` are the rest (ids, limits, outcome, error, …)."""
        return cls(
            ended_at=iso_now(), exit_code=None, signal=None, duration_ms=int((time.monotonic() - t0) * 1000),
            cpu_ms=0, peak_rss_kib=0, stdout_bytes=0, scratch_peak_bytes=0, stderr_tail="", network_enforced=False,
            **fields,
        )
