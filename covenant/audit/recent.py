"""The newest records of the audit log, read backwards from its end.

At start the daemon needs only the last few minutes of the log (the intent
ids of the replay window), not all of it: this reads each segment from its
end in blocks, newest segment first, and stops at the first record older
than the cut-off. Only lines of the wanted types are decoded; a line that
does not parse (a torn tail) is skipped — verify is the place that judges
the log, this only reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from covenant.audit.events import (
    AGENT_SPAWNED,
    DAEMON_START,
    DAEMON_STOP,
    INTENT_COMPLETED,
    INTENT_INTERRUPTED,
    INTENT_RECEIVED,
    POLICY_DECISION,
)
from covenant.audit.format import segment_name
from covenant.audit.store import list_segments
from covenant.clock import iso_ms

__all__ = ["records_since", "unfinished_intents", "UNFINISHED_SCAN_MAX_BYTES"]

_BLOCK = 1 << 20
# Every line ends with ``,"ts":"<24 characters>","type":"<type>","v":1}`` (canonical JSON sorts the
# keys, and `"` inside strings is escaped), so the last ``,"ts":"`` of a line is the record's own.
# The timestamps have one fixed format (covenant.clock.iso_ms), so they compare as bytes.
_TS = b',"ts":"'
_TS_LEN = 24


def _lines_backwards(path: Path) -> Iterator[bytes]:
    """The complete lines of ``path``, last first (a trailing partial line is included, and then skipped)."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        rest = b""
        while end > 0:
            start = max(0, end - _BLOCK)
            f.seek(start)
            block = f.read(end - start) + rest
            end = start
            lines = block.split(b"\n")
            rest = lines[0] if start > 0 else b""
            for line in reversed(lines if start == 0 else lines[1:]):
                if line:
                    yield line


def _newest_lines(directory: Path) -> Iterator[bytes]:
    """Every line of the log, newest first, across its segments (one removed meanwhile is skipped)."""
    for index in reversed(list_segments(directory)):
        try:
            yield from _lines_backwards(directory / segment_name(index))
        except FileNotFoundError:
            continue


def records_since(directory: Path, since_ms: int, types: frozenset[str]) -> list[dict[str, Any]]:
    """Records of ``types`` whose ``ts`` is at or after ``since_ms``, newest first.

    Reading stops at the first record (of any type) older than ``since_ms``.
    """
    found: list[dict[str, Any]] = []
    cutoff = iso_ms(max(since_ms, 0)).encode("ascii")
    endings = {f'","type":"{t}","v":1}}'.encode() for t in types}
    for line in _newest_lines(directory):
        at = line.rfind(_TS)
        if at < 0:
            continue
        start = at + len(_TS)
        ts = line[start : start + _TS_LEN]
        if len(ts) != _TS_LEN or not ts.endswith(b"Z"):
            continue
        if ts < cutoff:
            return found
        if line[start + _TS_LEN :] not in endings:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("data"), dict):
            found.append(record)
    return found


UNFINISHED_SCAN_MAX_BYTES = 256 * 1024 * 1024
"""How far back :func:`unfinished_intents` reads at most (a daemon that ran for months wrote more)."""
_TYPE = b',"type":"'
_INTENT_TYPES = frozenset({INTENT_RECEIVED, INTENT_COMPLETED, INTENT_INTERRUPTED, POLICY_DECISION, AGENT_SPAWNED})


def unfinished_intents(directory: Path) -> tuple[list[dict[str, Any]], bool]:
    """The intents the daemon's last run left unfinished, oldest first, and whether the scan was cut short.

    Reads the log backwards to the last ``daemon.start`` (or ``daemon.stop``: what came before a clean
    stop was finished). Nothing is unfinished when the newest daemon record is ``daemon.stop``.
    Unfinished means an ``intent.received`` (not a dry run) with neither an ``intent.completed``
    nor an ``intent.interrupted``, nor a ``policy.decision`` that refused it. Each is returned as
    ``{"intent", "issuer", "parent", "received", "agent", "spawned", "peer_uid"}`` (``agent`` null when it
    was never allowed; ``spawned`` the data of its ``agent.spawned`` — pid, argv, limits — or null;
    ``peer_uid`` the submitting client's uid, null when unknown or the log predates it).
    """
    ended: set[str] = set()
    agents: dict[str, str] = {}
    spawned: dict[str, dict[str, Any]] = {}
    unfinished: list[dict[str, Any]] = []
    read = 0
    for line in _newest_lines(directory):
        read += len(line) + 1
        if read > UNFINISHED_SCAN_MAX_BYTES:
            return unfinished[::-1], True
        type_ = _record_type(line)
        if type_ in (DAEMON_START, DAEMON_STOP):
            return unfinished[::-1], False
        if type_ not in _INTENT_TYPES:
            continue
        try:
            record = json.loads(line)
            data = record["data"]
            intent = data["intent"]
        except (ValueError, KeyError, TypeError):
            continue  # a torn line, or one without an intent: verify judges the log, not this
        if type_ == AGENT_SPAWNED:
            spawned.setdefault(intent, data)
        elif type_ == POLICY_DECISION:
            if data.get("allowed") is True and isinstance(data.get("agent"), str):
                agents[intent] = data["agent"]
            elif data.get("allowed") is False:
                ended.add(intent)
        elif type_ != INTENT_RECEIVED:
            ended.add(intent)
        elif intent not in ended and not data.get("dry_run"):
            unfinished.append({"intent": intent, "issuer": data.get("issuer"), "parent": data.get("parent"),
                               "received": record.get("ts"), "agent": agents.get(intent),
                               "spawned": spawned.get(intent), "peer_uid": _uid(data.get("peer_uid"))})
    return unfinished[::-1], False


def _uid(value: Any) -> int | None:
    """A uid as the log holds it: a non-negative int, else unknown (the log is signed, not typed)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _record_type(line: bytes) -> str | None:
    """The ``type`` of a record line without decoding it (canonical JSON puts it last but for ``v``)."""
    at = line.rfind(_TYPE)
    if at < 0:
        return None
    start = at + len(_TYPE)
    return line[start : line.find(b'"', start)].decode("ascii", "replace")
