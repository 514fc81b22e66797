"""An HTTP/1.1 response read incrementally, for the control-socket client (:mod:`covenant.client`).

The client sends one request per connection with ``Connection: close`` to the daemon's own
h11 server, which frames every answer with ``Content-Length`` or ``Transfer-Encoding:
chunked``. This reads exactly that and refuses the rest: a malformed status line or header,
a length that is not a plain decimal, two different lengths, a transfer coding other than
chunked, a head over 64 KiB, a bad chunk size. A body framed by neither ends only when the
peer closes, and is refused as well: the daemon never sends one.

It replaced httptools here (issue 38): httptools imports :mod:`typing`, ≈ 10 million
instructions of the ``covenant dispatch`` process (a third of ``python -c pass``), and the
process needs none of llhttp's generality for answers from its own daemon.
"""

from __future__ import annotations

__all__ = ["BadResponse", "ResponseReader"]

MAX_HEAD_BYTES = 65536
MAX_CHUNK_LINE_BYTES = 1024
_NO_BODY_STATUSES = frozenset({204, 304})


class BadResponse(Exception):
    """The bytes are not an HTTP/1.1 response this reader accepts."""


class ResponseReader:
    """Feed it bytes as they arrive (:meth:`feed`); it sets ``status``, ``headers`` and ``complete``,
    and hands out the body as it is undone (:meth:`take_body`)."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.complete = False
        self._buffer = b""
        self._head_scanned = 0  # how much of the buffer is known to hold no CRLFCRLF (a head fed byte by byte)
        self._body: list[bytes] = []
        self._remaining = 0  # bytes left of the body (content-length) or of the current chunk
        self._chunked = False
        self._chunk_state = "size"  # size -> data -> data-end -> size ... -> trailers

    def take_body(self) -> list[bytes]:
        """The body bytes undone since the last call."""
        body, self._body = self._body, []
        return body

    def feed(self, data: bytes) -> None:
        if self.complete:
            return  # after the message (Connection: close): nothing more is read
        self._buffer += data
        if not self.headers_done:
            end = self._buffer.find(b"\r\n\r\n", self._head_scanned)
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    raise BadResponse(f"a response head over {MAX_HEAD_BYTES} bytes")
                self._head_scanned = max(0, len(self._buffer) - 3)
                return
            if end > MAX_HEAD_BYTES:
                raise BadResponse(f"a response head over {MAX_HEAD_BYTES} bytes")
            head, self._buffer = self._buffer[:end], self._buffer[end + 4:]
            self._parse_head(head)
        if self._chunked:
            self._undo_chunks()
        else:
            self._take_length()

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if (len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or len(parts[1]) != 3
                or not parts[1].isdigit()):
            raise BadResponse(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip() or not name.isascii():
                raise BadResponse(f"a malformed header line: {line[:80]!r}")
            key = name.decode("ascii").lower()
            text = value.strip(b" \t").decode("latin-1")
            if key in self.headers and key == "content-length" and self.headers[key] != text:
                raise BadResponse("two different Content-Length headers")
            self.headers[key] = text
        self.headers_done = True
        coding = self.headers.get("transfer-encoding")
        if self.status < 200 or self.status in _NO_BODY_STATUSES:
            self.complete = True
        elif coding is not None:
            if coding.lower() != "chunked":
                raise BadResponse(f"transfer coding {coding!r}: only chunked is read")
            self._chunked = True
        elif "content-length" in self.headers:
            length = self.headers["content-length"]
            if not length.isascii() or not length.isdigit():
                raise BadResponse(f"Content-Length {length[:40]!r} is not a decimal number")
            self._remaining = int(length)
        else:
            raise BadResponse("a response with neither Content-Length nor chunked encoding")

    def _take_length(self) -> None:
        if self.complete:
            return
        if self._buffer:
            piece, self._buffer = self._buffer[:self._remaining], self._buffer[self._remaining:]
            self._remaining -= len(piece)
            if piece:
                self._body.append(piece)
        if self._remaining == 0:
            self.complete = True

    def _line(self) -> bytes | None:
        """The next CRLF-ended line of the chunked framing, or None until it has arrived."""
        end = self._buffer.find(b"\r\n")
        if end < 0:
            if len(self._buffer) > MAX_CHUNK_LINE_BYTES:
                raise BadResponse("a chunk-size or trailer line over 1 KiB")
            return None
        line, self._buffer = self._buffer[:end], self._buffer[end + 2:]
        return line

    def _undo_chunks(self) -> None:
        while not self.complete:
            if self._chunk_state == "size":
                line = self._line()
                if line is None:
                    return
                size = line.split(b";", 1)[0].strip(b" \t")
                if not size or len(size) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size):
                    raise BadResponse(f"a bad chunk size: {line[:40]!r}")
                self._remaining = int(size, 16)
                self._chunk_state = "data" if self._remaining else "trailers"
            elif self._chunk_state == "data":
                if not self._buffer:
                    return
                piece, self._buffer = self._buffer[:self._remaining], self._buffer[self._remaining:]
                self._remaining -= len(piece)
                self._body.append(piece)
                if self._remaining == 0:
                    self._chunk_state = "data-end"
            elif self._chunk_state == "data-end":
                if len(self._buffer) < 2:
                    return
                if self._buffer[:2] != b"\r\n":
                    raise BadResponse("a chunk not followed by CRLF")
                self._buffer = self._buffer[2:]
                self._chunk_state = "size"
            else:  # trailers, up to an empty line
                line = self._line()
                if line is None:
                    return
                if not line:
                    self.complete = True
