"""Framing between the daemon and its audit writer process.

Daemon to writer: length-prefixed frames (4 bytes, little endian, then the
payload), because a record's data may be large. An audit record's payload is
``a type NUL timestamp NUL canonical data``; a dispatch record's is ``d`` and
its line. Writer to daemon: one JSON object per line (acknowledgements are
small and few).
"""

from __future__ import annotations

import struct
from typing import Iterator

__all__ = ["FrameReader", "frame", "event_frame", "dispatch_frame", "DISPATCH", "PROTOCOL"]

_LENGTH = struct.Struct("<I")
PROTOCOL = 1
"""Bump on any change to these frames or the writer's answers. A daemon restarts its writer after a
failed write, from the code on disk then: after an upgrade under a running daemon, the two may differ."""
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
