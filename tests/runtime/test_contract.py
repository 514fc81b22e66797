"""The one-line contract, rule by rule (pure functions)."""

from __future__ import annotations

import json

import pytest

from covenant.runtime.contract import intent_line, parse_output
from covenant.runtime.outcome import OUTCOMES, DispatchRecord, outcome_exit_code

ID = "0b0e5a0e-0000-4000-8000-000000000000"


def line(**fields: object) -> bytes:
    base = {"intent_id": ID, "status": "ok", "text": "hi", "sources": []}
    base.update(fields)
    return json.dumps(base).encode() + b"\n"


def test_valid_result_and_blank_lines() -> None:
    parsed = parse_output(b"\n" + line() + b"\n  \n", ID)
    assert parsed.problem is None and parsed.result == {"intent_id": ID, "status": "ok", "text": "hi", "sources": []}


def test_missing_final_newline_is_accepted() -> None:
    assert parse_output(line().rstrip(b"\n"), ID).result is not None


@pytest.mark.parametrize(
    ("stdout", "needle"),
    [
        (b"hello\n", "not a JSON line"),
        (line() + line(), "2 non-empty lines"),
        (line(intent_id="other"), "does not echo"),
        (line(status="fine"), "status"),
        (line(text=3), "text must be a string"),
        (line(sources="a"), "sources must be a list"),
        (line(sources=[1]), "sources must be a list"),
        (line(extra=1), "unknown keys extra"),
        (b"[1]\n", "JSON object"),
        (b'{"intent_id": NaN}\n', "not valid JSON"),
        (b"\xff\xfe\n", "not a JSON line"),
    ],
)
def test_protocol_problems_quote_the_output(stdout: bytes, needle: str) -> None:
    parsed = parse_output(stdout, ID)
    assert parsed.result is None and not parsed.empty
    assert parsed.problem is not None and needle in parsed.problem


def test_missing_key_is_named() -> None:
    parsed = parse_output(json.dumps({"intent_id": ID, "status": "ok", "text": ""}).encode(), ID)
    assert parsed.problem is not None and "lacks sources" in parsed.problem


def test_empty_output() -> None:
    assert parse_output(b"", ID).empty and parse_output(b"\n \n", ID).empty


def test_intent_line_is_one_line() -> None:
    data = intent_line({"id": ID, "text": "a\nb é"})
    assert data.count(b"\n") == 1 and data.endswith(b"\n")
    assert json.loads(data)["text"] == "a\nb é"


def test_exit_codes() -> None:
    codes = {o: outcome_exit_code(o) for o in OUTCOMES}  # type: ignore[arg-type]
    assert codes.pop("ok") == 0 and codes.pop("agent_error") == 1 and codes.pop("cancelled") == 5
    assert codes.pop("session_forbidden") == 3  # a denial: the session belongs to another issuer
    assert set(codes.values()) == {4}
    # step_failed: a workflow step failed for good (docs/workflows.md); interrupted: written at the next start
    # for an intent a killed daemon had in flight (docs/runtime.md); disk_exceeded for any agent (DESIGN.md §7)
    assert len(OUTCOMES) == 24 and codes["interrupted"] == 4 and codes["disk_exceeded"] == 4


def test_record_has_integer_fields_only() -> None:
    for name, field in DispatchRecord.model_fields.items():
        assert "float" not in str(field.annotation), name
