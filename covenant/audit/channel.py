"""Framing between the daemon and its audit writer process.

Daemon to writer: length-prefixed frames (4 bytes, little endian, then the
payload), because a record's data may be large. An audit record's payload is
``a type NUL timestamp NUL canonical data``; a dispatch record's is ``d`` and
its line. Writer to daemon: one JSON object per line (acknowledgements are
small and few), among them what the writer has to report (:func:`log_message`),
which the daemon writes to its log (:func:`log_call`).

The writer process imports this module and runs without ``logging`` (≈ 1.2 MB of its RSS with
traceback, linecache and tokenize, issue 38): only :func:`log_call`, the daemon's half, uses it.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import logging

__all__ = ["FrameReader", "frame", "event_frame", "dispatch_frame", "log_message", "log_call", "DISPATCH", "PROTOCOL"]

_LENGTH = struct.Struct("<I")
PROTOCOL = 2
"""Bump on any change to these frames or the writer's answers (2: its log lines). A daemon restarts
its writer after a failed write, from the code on disk then: after an upgrade under a running daemon,
the two may differ."""
DISPATCH = b"d"


def frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


def event_frame(type_: str, ts: str, data: bytes) -> bytes:
    """One audit record as the writer process reads it."""
    payload = b"a%s\x00%s\x00%s" % (type_.encode(), ts.encode(), data)
    return _LENGTH.pack(len(payload)) + payload


def dispatch_frame(line: bytes) -> bytes:
    """One dispatch record (its line in a segment file) as the writer process reads it."""
    return _LENGTH.pack(len(line) + 1) + DISPATCH + line


class FrameReader:
    """Cuts a byte stream into frames; keeps a partial frame for the next chunk."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        buffer = self._buffer
        buffer += chunk
        start = 0
        while len(buffer) - start >= 4:
            (size,) = _LENGTH.unpack_from(buffer, start)
            end = start + 4 + size
            if end > len(buffer):
                break
            yield bytes(buffer[start + 4 : end])
            start = end
        del buffer[:start]


def log_message(level: str, logger: str, message: str, fields: dict[str, Any]) -> dict[str, Any]:
    """What the writer process reports, as the ``log`` message it sends: the fields that are plain
    values go along (the daemon checks their names, :func:`log_call`)."""
    plain = {key: value for key, value in fields.items() if value is None or isinstance(value, (str, int, bool))}
    return {"level": level, "logger": logger, "msg": message, "fields": plain}


def log_call(entry: Any) -> tuple[logging.Logger, int, str, dict[str, Any]]:
    """(logger, level, message, extra) to log a ``log`` message from the writer in the daemon.

    The writer is covenant's own process, but its message is still checked: a logger outside
    ``covenant.`` becomes ``covenant.audit``, an unknown level WARNING, and a field that would
    clash with a LogRecord attribute (``logging`` raises on those) is dropped.
    """
    import logging  # here: the writer process imports this module and runs without logging

    from covenant.log_extras import is_extra  # it builds a LogRecord at import

    entry = entry if isinstance(entry, dict) else {}
    level = logging.getLevelName(str(entry.get("level", "")))
    name = str(entry.get("logger", ""))
    fields = entry.get("fields") if isinstance(entry.get("fields"), dict) else {}
    extra = {key: value for key, value in fields.items() if isinstance(key, str) and is_extra(key)}
    return (
        logging.getLogger(name if name.startswith("covenant.") else "covenant.audit"),
        level if isinstance(level, int) else logging.WARNING,
        str(entry.get("msg", "")),
        extra,
    )
