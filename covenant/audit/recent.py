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

from covenant.audit.format import segment_name
from covenant.audit.store import list_segments
from covenant.clock import iso_ms

__all__ = ["records_since"]

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


def records_since(directory: Path, since_ms: int, types: frozenset[str]) -> list[dict[str, Any]]:
    """Records of ``types`` whose ``ts`` is at or after ``since_ms``, newest first.

    Reading stops at the first record (of any type) older than ``since_ms``.
    """
    found: list[dict[str, Any]] = []
    cutoff = iso_ms(max(since_ms, 0)).encode("ascii")
    endings = {f'","type":"{t}","v":1}}'.encode() for t in types}
    for index in reversed(list_segments(directory)):
        try:
            for line in _lines_backwards(directory / segment_name(index)):
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
        except FileNotFoundError:
            continue
    return found
