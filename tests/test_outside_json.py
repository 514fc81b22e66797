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
