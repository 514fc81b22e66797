"""How a run ended, in words: its outcome and its dispatch record.

A limit crossed first always wins; then signals, then what the agent wrote
on stdout and its exit code (docs/runtime.md lists every outcome).
"""

from __future__ import annotations

import signal
import time
from typing import Any

from covenant.clock import iso_now
from covenant.runtime.contract import parse_output
from covenant.runtime.outcome import Cleanup, DispatchRecord, Outcome
from covenant.runtime.run_state import RunState
from covenant.runtime.tree_removal import Removal

__all__ = ["build_record", "classify"]

_MIB = 1024 * 1024


def build_record(
    d: RunState, base: dict[str, Any], t0: float, left: Removal, stderr_tail_bytes: int
) -> DispatchRecord:
    """The record of a finished run: ``base`` (ids, limits, start) plus how it ended; ``left`` is what it
    left behind, removed (its bytes, and whether the removal was complete). ``scratch_peak_bytes`` is the
    most it held on disk: the largest sample (:mod:`covenant.runtime.disk_use`), or what it left if more."""
    scratch_bytes = max(left.bytes, d.disk.peak_bytes if d.disk is not None else 0)
    status = d.launched.status
    exit_code = status.exit_code if status else None
    sig = status.signal if status else None
    outcome, error, result = classify(d, exit_code, sig)
    notes = list(d.notes)
    disk_bytes = d.agent.resources.disk_mb * _MIB
    if scratch_bytes > disk_bytes and outcome != "disk_exceeded":  # another limit was crossed first
        notes.append(f"it held {scratch_bytes} bytes on disk, over disk_mb = {d.agent.resources.disk_mb}")
    if notes:
        error = "; ".join([error, *notes] if error else notes)
    tail = bytes(d.stderr_tail[-stderr_tail_bytes:])
    return DispatchRecord(
        **base,
        argv=d.launched.argv,
        pid=d.launched.pid,
        ended_at=iso_now(),
        exit_code=exit_code,
        signal=sig,
        outcome=outcome,
        error=error,
        duration_ms=int((time.monotonic() - t0) * 1000),
        cpu_ms=max(d.tree.cpu_ms, status.cpu_ms if status else 0),
        peak_rss_kib=d.tree.peak_rss_kib,
        stdout_bytes=d.stdout_bytes,
        scratch_peak_bytes=scratch_bytes,
        stderr_tail=tail.decode("utf-8", "replace"),
        result=None if d.verdict is not None else result,
        network_enforced=d.launched.network_enforced,
        left_behind=d.left_behind,
        stderr_unlogged_bytes=d.stderr_unlogged_bytes,
        cleanup=Cleanup(complete=left.complete, reason=left.reason),
    )

def classify(
    d: RunState, exit_code: int | None, sig: int | None
) -> tuple[Outcome, str | None, dict[str, Any] | None]:
    """The outcome from what happened; a limit crossed first always wins."""
    if d.verdict is not None:
        return d.verdict, d.error, None
    if sig == signal.SIGXCPU:
        return "cpu_exceeded", "the agent hit the RLIMIT_CPU backstop (SIGXCPU)", None
    parsed = parse_output(bytes(d.stdout), d.intent_id)
    if sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        why = " (a file outgrew disk_mb: RLIMIT_FSIZE)" if sig == signal.SIGXFSZ else ""
        return "crashed", f"the agent was killed by signal {name}{why}", parsed.result
    if parsed.result is not None:
        if parsed.result["status"] == "error":
            return "agent_error", None, parsed.result
        if exit_code == 0:
            return "ok", None, parsed.result
        return "crashed", f"the agent answered ok but exited with code {exit_code}", parsed.result
    if exit_code not in (0, None):
        detail = f"; stdout: {parsed.problem}" if parsed.problem else ""
        return "crashed", f"the agent exited with code {exit_code} without a valid result{detail}", None
    if parsed.empty:
        return "no_result", "the agent exited with code 0 without writing a result line on stdout", None
    return "protocol_error", parsed.problem, None
