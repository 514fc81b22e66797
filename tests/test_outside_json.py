"""JSON from outside covenant: any shape of nesting is a ValueError naming the limit, never a RecursionError."""

from __future__ import annotations

import sys

import pytest

from covenant import outside_json
from covenant.outside_json import MAX_DEPTH, TooDeep


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_the_limit_itself_parses_and_one_more_level_does_not() -> None:
    assert outside_json.loads(nested(MAX_DEPTH)) == eval(nested(MAX_DEPTH))  # noqa: S307 - literal lists
    with pytest.raises(TooDeep, match=f"deeper than {MAX_DEPTH} levels"):
        outside_json.loads(nested(MAX_DEPTH + 1))


@pytest.mark.parametrize("text", [nested(200_000), '{"a":' * 200_000 + "1" + "}" * 200_000])
def test_past_the_recursion_limit_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="deeper than"):
        outside_json.loads(text)
    with pytest.raises(ValueError, match="deeper than"):
        outside_json.loads(text.encode())


def test_a_caller_deep_in_its_own_stack_still_gets_a_value_error() -> None:
    """How deep json.loads may go depends on the caller's stack; the limit does not."""
    def descend(frames: int) -> None:
        if frames:
            descend(frames - 1)
            return
        with pytest.raises(TooDeep):
            outside_json.loads(nested(MAX_DEPTH + 1))
        assert outside_json.loads(nested(MAX_DEPTH))

    descend(sys.getrecursionlimit() - 200)


def test_many_brackets_side_by_side_are_not_depth() -> None:
    text = "[" + ",".join(["[]"] * 1000) + "]"
    assert len(outside_json.loads(text)) == 1000
    assert outside_json.loads('{"a": "[[[[[[' + "[" * 100 + '"}') == {"a": "[[[[[[" + "[" * 100}


def test_options_pass_through_and_other_errors_stay_value_errors() -> None:
    with pytest.raises(ValueError, match="NaN"):
        outside_json.loads("[NaN]", parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    with pytest.raises(ValueError):
        outside_json.loads("[1,")


@pytest.mark.parametrize("text", ['{"t": "a\\ud800b"}', b'{"t": "a\\ud800b"}', b'{"t": "a\xed\xa0\x80b"}',
                                  '{"t": "a\\udfffb"}', '{"t": "a\\ud83db"}'])
def test_a_lone_surrogate_becomes_the_replacement_character(text: str | bytes) -> None:
    value = outside_json.loads(text)
    assert value == {"t": "a\ufffdb"}
    value["t"].encode("utf-8")  # what the audit writer and the dispatch record do with it


def test_keys_and_nested_strings_are_replaced_and_a_valid_pair_is_kept() -> None:
    value = outside_json.loads('{"k\\udc00": [["\\ud800"], {"x": "\\ud83d\\ude00"}]}')
    assert value == {"k\ufffd": [["\ufffd"], {"x": "\U0001f600"}]}


def test_refuse_raises_a_value_error_naming_the_surrogate() -> None:
    with pytest.raises(outside_json.LoneSurrogate, match="lone surrogate"):
        outside_json.loads(b'{"text": "\\ud800"}', surrogates="refuse")
    assert outside_json.loads(b'{"text": "\\ud83d\\ude00 \\\\ud800"}', surrogates="refuse") == {
        "text": "\U0001f600 \\ud800"}  # an escaped backslash before "ud800" is text, not a surrogate


@pytest.mark.parametrize(("body", "holds"), [
    (b'{"text": "\\ud800"}', True),
    (b'{"text": "\xed\xa0\x80"}', True),
    (b'{"a": [{"b": "\\uDBFF"}]}', True),
    (b'{"text": "\\ud83d\\ude00"}', False),
    (b'{"text": "plain"}', False),
    (b"not json \\ud800", False),
])
def test_holds_lone_surrogate(body: bytes, holds: bool) -> None:
    assert outside_json.holds_lone_surrogate(body) is holds


def test_scrub_is_iterative_at_any_depth() -> None:
    deep: list = ["\ud800"]
    for _ in range(100_000):
        deep = [deep]
    outside_json.scrub(deep)
    while isinstance(deep[0], list):
        deep = deep[0]
    assert deep == ["\ufffd"]
