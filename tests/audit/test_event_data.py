"""What audit event data the log refuses, and that the error names exactly where."""

from __future__ import annotations

import re

import pytest

from covenant.audit.errors import AuditDataError
from covenant.audit.events import encode_event_data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"limits": {"cpu": 0.5}}, "audit data data.limits.cpu is a float (0.5)"),
        ({"runs": [{"ok": 1}, {"ms": [1, 2.0]}]}, "audit data data.runs[1].ms[1] is a float (2.0)"),
        ({"pair": (1, {2: "x"})}, "audit data data.pair[1] has a non-string key 2"),
        ({"when": {"at": b"raw"}}, "audit data data.when.at has unsupported type bytes"),
    ],
)
def test_a_refused_value_is_named_by_its_path(data: dict, message: str) -> None:
    with pytest.raises(AuditDataError, match=re.escape(message)):
        encode_event_data("agent.exited", data)


def test_plain_data_is_encoded_canonically() -> None:
    data = {"b": [1, True, None, ("x", {"y": "z"})], "a": "é"}
    assert encode_event_data("agent.exited", data) == '{"a":"é","b":[1,true,null,["x",{"y":"z"}]]}'.encode()
