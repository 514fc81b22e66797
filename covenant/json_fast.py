"""JSON through CPython's ``_json`` accelerator, without importing the :mod:`json` package.

``import json`` also imports :mod:`re`, and ``re`` imports :mod:`enum`: together ≈ 26 million
instructions, a third of what a whole ``covenant dispatch`` costs over a bare interpreter (issue 38).
The encoding and decoding themselves are ``_json``'s C code either way: :func:`dumps` and
:func:`loads` build the same C encoder and scanner ``json.dumps`` and ``json.loads`` use (the encoder
only serves documents without ``indent``, as there), so the bytes are the same; a test holds them to
``json``'s output. Only the error path imports :mod:`json` (``_json`` raises ``json.JSONDecodeError``),
and an interpreter without ``_json`` gets :mod:`json` itself.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["dumps", "loads"]

try:
    from _json import encode_basestring, encode_basestring_ascii, make_encoder, make_scanner
except ImportError:  # not CPython: the json package does the same work
    make_encoder = None

_WHITESPACE = " \t\n\r"


def _not_serializable(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(obj: Any, *, sort_keys: bool = False, compact: bool = False, ensure_ascii: bool = True,
          allow_nan: bool = True) -> str:
    """``json.dumps(obj, sort_keys=…, ensure_ascii=…, allow_nan=…)``, with ``separators=(",", ":")`` when
    ``compact``."""
    item_separator, key_separator = (",", ":") if compact else (", ", ": ")
    if make_encoder is None:
        import json

        return json.dumps(obj, sort_keys=sort_keys, ensure_ascii=ensure_ascii, allow_nan=allow_nan,
                          separators=(item_separator, key_separator))
    string = encode_basestring_ascii if ensure_ascii else encode_basestring
    if isinstance(obj, str):
        return string(obj)
    encode = make_encoder({}, _not_serializable, string, None, key_separator, item_separator, sort_keys,
                          False, allow_nan)
    return "".join(encode(obj, 0))


class _Context:
    """What ``_json.make_scanner`` reads off a ``json.JSONDecoder``: plain JSON, Python's own numbers."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


_scan = make_scanner(_Context()) if make_encoder is not None else None


def loads(document: str | bytes | bytearray) -> Any:
    """``json.loads(document)`` for a UTF-8 or text document: a ValueError when it is not one JSON value."""
    if _scan is None:
        import json

        return json.loads(document)
    text = document.decode("utf-8") if isinstance(document, (bytes, bytearray)) else document
    length = len(text)
    start = 0
    while start < length and text[start] in _WHITESPACE:
        start += 1
    try:
        value, end = _scan(text, start)
    except StopIteration:
        raise ValueError(f"expecting a JSON value at character {start}") from None
    while end < length and text[end] in _WHITESPACE:
        end += 1
    if end != length:
        raise ValueError(f"extra data after the JSON value at character {end}")
    return value
