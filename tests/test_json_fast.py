"""covenant.json_fast gives the bytes the json package gives, and refuses what it refuses."""

from __future__ import annotations

import json

import pytest

from covenant import json_fast

DOCUMENTS = [
    {"b": 1, "a": [1, 2.5, "é\u2028\x00\x1b", None, True, False, {"z": {}, "y": []}]},
    "x\u202e\ud800",
    10**40,
    -0.0,
    1e300,
    [],
    {},
    "",
    [[[[["deep"]]]]],
    {"ключ": "значение", "emoji": "\U0001f600"},
]


@pytest.mark.parametrize("document", DOCUMENTS)
@pytest.mark.parametrize("sort_keys", [False, True])
@pytest.mark.parametrize("ensure_ascii", [False, True])
@pytest.mark.parametrize("compact", [False, True])
def test_dumps_matches_the_json_package(document: object, sort_keys: bool, ensure_ascii: bool, compact: bool) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    expected = json.dumps(document, sort_keys=sort_keys, ensure_ascii=ensure_ascii, separators=separators)
    assert json_fast.dumps(document, sort_keys=sort_keys, ensure_ascii=ensure_ascii, compact=compact) == expected


@pytest.mark.parametrize("document", DOCUMENTS)
def test_loads_reads_what_the_json_package_reads(document: object) -> None:
    text = json.dumps(document)
    assert json_fast.loads(text) == json.loads(text)
    assert json_fast.loads(f" \n{text}\t\r\n".encode()) == json.loads(text)


def test_out_of_range_floats_and_unknown_types_are_refused_as_json_refuses_them() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        json_fast.dumps([float("nan")], allow_nan=False)
    assert json_fast.dumps([float("inf")]) == json.dumps([float("inf")])
    with pytest.raises(TypeError, match="not JSON serializable"):
        json_fast.dumps({"a": object()})
    with pytest.raises(ValueError, match="Circular"):
        looped: list[object] = []
        looped.append(looped)
        json_fast.dumps(looped)


@pytest.mark.parametrize("bad", ["", "   ", "[1,", "{} x", "nul", "{'a': 1}", "[1] [2]", b"\xff\xfe", "\"\x01\""])
def test_loads_refuses_what_is_not_one_json_value(bad: str | bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(bad)
    with pytest.raises(ValueError):
        json_fast.loads(bad)


def test_loads_of_a_document_nested_past_the_recursion_limit_raises_and_does_not_crash() -> None:
    with pytest.raises(RecursionError):
        json_fast.loads("[" * 100_000 + "]" * 100_000)
