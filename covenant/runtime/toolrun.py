"""The runner's tool mode: one JSON document out, and how a tool run ended.

A process tool (docs/tools.md) reads one JSON document on stdin and writes
one on stdout. Unlike the agent contract there is no intent id to echo and
no status/text shape: any single JSON value is a result. A limit crossed
first always wins, then signals, then the exit code, then stdout.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from typing import Any

from covenant.runtime.contract import preview
from covenant.runtime.outcome import Outcome
from covenant.runtime.run_state import RunState

__all__ = ["ToolRun", "parse_document", "tool_run_record"]

_MIB = 1024 * 1024


@dataclass(frozen=True)
class ToolRun:
    """How one run of a process tool ended, as the runner observed it (integers only)."""

    outcome: Outcome
    """``ok``, ``timeout``, ``cpu_exceeded``, ``memory_exceeded``, ``disk_exceeded``, ``output_too_large``,
    ``protocol_error`` (stdout is not one JSON document), ``no_result`` (nothing on stdout),
    ``crashed`` (non-zero exit or a signal), ``spawn_failed`` or ``cancelled``."""
    error: str | None
    result: Any
    """The parsed document when ``outcome`` is ``ok``; None otherwise."""
    argv: list[str]
    pid: int | None
    exit_code: int | None
    signal: int | None
    duration_ms: int
    cpu_ms: int
    peak_rss_kib: int
    stdout_bytes: int
    stderr_tail: str
    stdout: bytes = b""
    """What was read of stdout (at most ``runtime.stdout_cap_bytes``), whatever the outcome."""
    left_behind: int = 0
    """Processes still running once the tool's own process had ended, killed (its run's ``left_behind``)."""

    @classmethod
    def spawn_failed(cls, argv: list[str], message: str, t0: float) -> "ToolRun":
        return cls(
            outcome="spawn_failed",
            error=message,
            result=None,
            argv=argv,
            pid=None,
            exit_code=None,
            signal=None,
            duration_ms=int((time.monotonic() - t0) * 1000),
            cpu_ms=0,
            peak_rss_kib=0,
            stdout_bytes=0,
            stderr_tail="",
        )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_document(stdout: bytes) -> tuple[Any, str | None, bool]:
    """``(value, problem, empty)``: exactly one JSON document (surrounding whitespace allowed). A lone
    surrogate in it is refused by the tool host (``tool_bad_output``, :mod:`covenant.tools.result`)."""
    if not stdout.strip():
        return None, None, True
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"stdout is not UTF-8 ({exc.reason} at byte {exc.start}): {preview(stdout)}", False
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    start = len(text) - len(text.lstrip())
    try:
        value, end = decoder.raw_decode(text, start)
    except RecursionError:
        return None, f"stdout holds a JSON document nested too deep to read: {preview(stdout)}", False
    except ValueError as exc:
        return None, f"stdout is not a JSON document ({exc}): {preview(stdout)}", False
    if text[end:].strip():
        rest = text[end:].lstrip().encode()
        return None, f"stdout holds more than one JSON document; after the first: {preview(rest)}", False
    return value, None, False


def _classify(d: RunState, exit_code: int | None, sig: int | None) -> tuple[Outcome, str | None, Any]:
    if d.verdict is not None:
        return d.verdict, d.error, None
    if sig == signal.SIGXCPU:
        return "cpu_exceeded", "the tool hit the RLIMIT_CPU backstop (SIGXCPU)", None
    if sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        why = " (a file outgrew disk_mb: RLIMIT_FSIZE)" if sig == signal.SIGXFSZ else ""
        return "crashed", f"the tool was killed by signal {name}{why}", None
    if exit_code not in (0, None):
        return "crashed", f"the tool exited with code {exit_code}", None
    value, problem, empty = parse_document(bytes(d.stdout))
    if empty:
        return "no_result", "the tool exited with code 0 without writing a JSON document on stdout", None
    if problem is not None:
        return "protocol_error", problem, None
    return "ok", None, value


def tool_run_record(d: RunState, t0: float, scratch_bytes: int, stderr_tail_bytes: int) -> ToolRun:
    """The record of a finished tool run."""
    status = d.launched.status
    exit_code = status.exit_code if status else None
    sig = status.signal if status else None
    outcome, error, result = _classify(d, exit_code, sig)
    notes = list(d.notes)
    if scratch_bytes > d.agent.resources.disk_mb * _MIB and outcome != "disk_exceeded":  # another limit first
        notes.append(f"it held {scratch_bytes} bytes on disk, over disk_mb = {d.agent.resources.disk_mb}")
    if notes:
        error = "; ".join([error, *notes] if error else notes)
    tail = bytes(d.stderr_tail[-stderr_tail_bytes:])
    return ToolRun(
        outcome=outcome,
        error=error,
        result=result,
        argv=list(d.launched.argv),
        pid=d.launched.pid,
        exit_code=exit_code,
        signal=sig,
        duration_ms=int((time.monotonic() - t0) * 1000),
        cpu_ms=max(d.tree.cpu_ms, status.cpu_ms if status else 0),
        peak_rss_kib=d.tree.peak_rss_kib,
        stdout_bytes=d.stdout_bytes,
        stderr_tail=tail.decode("utf-8", "replace"),
        stdout=bytes(d.stdout),
        left_behind=d.left_behind,
    )
