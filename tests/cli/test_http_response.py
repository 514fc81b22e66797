"""covenant.http_response.ResponseReader: the control-socket client's reading of HTTP/1.1 answers.

Every answer is fed whole, and again one byte at a time (a reader must not care where recv() splits
the stream); malformed and unsupported framings are refused with BadResponse, never read as a body.
"""

from __future__ import annotations

import pytest

from covenant.http_response import MAX_HEAD_BYTES, BadResponse, ResponseReader


def read(answer: bytes, *, bytewise: bool) -> ResponseReader:
    reader = ResponseReader()
    pieces = [answer[i:i + 1] for i in range(len(answer))] if bytewise else [answer]
    for piece in pieces:
        reader.feed(piece)
    return reader


def body_of(reader: ResponseReader) -> bytes:
    return b"".join(reader.take_body())


@pytest.mark.parametrize("bytewise", [False, True])
def test_content_length_and_chunked_bodies(bytewise: bool) -> None:
    plain = read(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 12\r\n\r\n{\"ok\": true}",
                 bytewise=bytewise)
    assert (plain.status, plain.complete, plain.headers["content-type"]) == (200, True, "application/json")
    assert body_of(plain) == b'{"ok": true}'

    chunked = read(b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"5;ext=1\r\nhello\r\n1A\r\n" + b"x" * 26 + b"\r\n0\r\nX-Trailer: t\r\n\r\n", bytewise=bytewise)
    assert (chunked.status, chunked.complete) == (404, True)
    assert body_of(chunked) == b"hello" + b"x" * 26

    empty = read(b"HTTP/1.1 204 No Content\r\n\r\n", bytewise=bytewise)
    assert empty.complete and body_of(empty) == b""
    zero = read(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", bytewise=bytewise)
    assert zero.complete and body_of(zero) == b""


def test_a_body_arrives_piece_by_piece_and_bytes_after_the_message_are_ignored() -> None:
    reader = ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01234")
    assert reader.headers_done and not reader.complete and reader.take_body() == [b"01234"]
    reader.feed(b"56789EXTRA")
    assert reader.complete and reader.take_body() == [b"56789"]
    reader.feed(b"more")
    assert reader.take_body() == []

    stream = ResponseReader()
    stream.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n7\r\nevent: ")
    assert not stream.complete and stream.take_body() == [b"event: "]
    stream.feed(b"\r\n")
    assert not stream.complete and stream.take_body() == []


@pytest.mark.parametrize("answer", [
    b"garbage, not HTTP at all\r\n\r\n",
    b"HTTP/2 200 OK\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 20x OK\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n: empty name\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length : 2\r\n\r\nhi",  # whitespace before the colon
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n folded: line\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 0x10\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: \xd9\xa3\r\n\r\n",  # an Arabic-Indic digit: isdigit() says yes
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\nclose-delimited body",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"1" * 17 + b"\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhiXX0\r\n\r\n",  # no CRLF after the data
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"2" * 2000,  # a size line that never ends
    b"HTTP/1.1 200 OK\r\nx: " + b"a" * MAX_HEAD_BYTES,  # a head that never ends
])
@pytest.mark.parametrize("bytewise", [False, True])
def test_malformed_or_unsupported_answers_are_refused(answer: bytes, bytewise: bool) -> None:
    with pytest.raises(BadResponse):
        read(answer, bytewise=bytewise)
