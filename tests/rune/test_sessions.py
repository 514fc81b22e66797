"""Session files: hash-linked records verified before load; torn tails cut, tampering refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from covenant.canonical import canonical_bytes
from covenant.rune.sessions import SessionCorrupt, SessionLog, session_path, valid_session_id, verify_file


def make(tmp_path: Path, turns: int = 3) -> Path:
    path = session_path(tmp_path, "chat@local", "s1")
    log = SessionLog.create(path, agent="chat@local", session="s1", issuer="ab" * 32, now_ms=1)
    for n in range(turns):
        log.append_turn(f"intent-{n}", [{"role": "user", "content": f"question {n} é"},
                                        {"role": "assistant", "content": f"answer {n}"}])
    return path


def test_a_written_session_verifies_and_reloads(tmp_path: Path) -> None:
    path = make(tmp_path)
    found = verify_file(path)
    assert [r["seq"] for r in found.records] == [0, 1, 2, 3]
    assert found.header["issuer"] == "ab" * 32
    assert found.turns[2]["messages"][1]["content"] == "answer 2"
    assert "question 0 é" in path.read_text(encoding="utf-8")  # text stored as plain JSON strings
    again = SessionLog.open(path)
    again.append_turn("intent-9", [{"role": "user", "content": "more"}])
    assert len(verify_file(path).records) == 5


@pytest.mark.parametrize("target", ["answer 1", "question 2", "intent-0", "chat@local"])
def test_one_changed_byte_anywhere_is_refused(tmp_path: Path, target: str) -> None:
    path = make(tmp_path)
    raw = path.read_bytes()
    at = raw.index(target.encode())
    path.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    with pytest.raises(SessionCorrupt, match=str(path)):
        SessionLog.open(path)


def test_the_last_record_is_covered_too(tmp_path: Path) -> None:
    path = make(tmp_path)
    raw = path.read_bytes()
    at = raw.rindex(b"answer 2")
    path.write_bytes(raw[:at] + b"ANSWER 2" + raw[at + 8:])
    with pytest.raises(SessionCorrupt, match="does not match its hash"):
        verify_file(path)


def test_reordered_or_removed_records_are_refused(tmp_path: Path) -> None:
    path = make(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([lines[0], lines[2], lines[1], lines[3]]))
    with pytest.raises(SessionCorrupt, match="seq"):
        verify_file(path)
    path.write_bytes(b"".join([lines[0], lines[1], lines[3]]))
    with pytest.raises(SessionCorrupt):
        verify_file(path)


def test_a_recomputed_record_still_breaks_the_chain(tmp_path: Path) -> None:
    """Rewriting a middle record with a fresh self-hash is caught by the next record's prev."""
    from covenant.rune.sessions import record_hash

    path = make(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[1])
    record["messages"][1]["content"] = "forged"
    record["hash"] = record_hash(record)
    lines[1] = canonical_bytes(record) + b"\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(SessionCorrupt, match=":3: prev"):
        verify_file(path)


def test_a_record_re_encoded_out_of_canonical_form_is_refused(tmp_path: Path) -> None:
    """Same content, other bytes (``é`` escaped as ``\\u00e9``): the writer never writes that, so it was edited."""
    path = make(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = json.dumps(json.loads(lines[1]), sort_keys=True, separators=(",", ":")).encode() + b"\n"
    assert b"\\u00e9" in lines[1]
    path.write_bytes(b"".join(lines))
    with pytest.raises(SessionCorrupt, match=":2: the record is not in canonical form"):
        verify_file(path)


def test_a_torn_tail_is_cut_and_reported(tmp_path: Path) -> None:
    path = make(tmp_path)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"kind":"turn","intent":"x","mess')
    checked = verify_file(path)  # only checks: the tail is reported and left in place
    assert checked.torn_bytes == len(b'{"kind":"turn","intent":"x","mess') and len(checked.records) == 4
    assert path.read_bytes() != whole
    log = SessionLog.open(path)
    assert log.verified.torn_bytes == len(b'{"kind":"turn","intent":"x","mess')
    assert path.read_bytes() == whole
    log.append_turn("after", [{"role": "user", "content": "ok"}])
    assert len(verify_file(path).records) == 5


def test_an_invalid_last_line_with_newline_is_corruption_not_a_tear(tmp_path: Path) -> None:
    path = make(tmp_path)
    path.write_bytes(path.read_bytes() + b"{not json\n")
    with pytest.raises(SessionCorrupt, match="not a JSON record"):
        verify_file(path)


def test_create_refuses_to_overwrite(tmp_path: Path) -> None:
    path = make(tmp_path, turns=0)
    with pytest.raises(FileExistsError):
        SessionLog.create(path, agent="chat@local", session="s1", issuer="cd" * 32, now_ms=2)


@pytest.mark.parametrize(("value", "ok"), [("a", True), ("A-z_0.9", True), ("x" * 128, True), ("", False),
                                            ("x" * 129, False), ("a/b", False), ("a b", False), ("é", False)])
def test_session_ids(value: str, ok: bool) -> None:
    assert valid_session_id(value) is ok


def test_a_new_session_is_written_by_its_first_checkpoint(tmp_path: Path) -> None:
    path = session_path(tmp_path, "chat@local", "fresh")
    log = SessionLog.new(path, agent="chat@local", session="fresh", issuer="ab" * 32, now_ms=5)
    assert not path.exists() and log.verified.turns == []
    log.append_turn("i1", [{"role": "user", "content": "hi"}])
    log.append_turn("i2", [{"role": "user", "content": "again"}])
    found = verify_file(path)
    assert [r["seq"] for r in found.records] == [0, 1, 2] and found.header["created_ms"] == 5
    assert found.records == log.verified.records


def test_a_line_nested_past_the_recursion_limit_is_corruption(tmp_path: Path) -> None:
    """A session file is written by a process of the agent's uid: any bytes may be in it."""
    path = make(tmp_path)
    with path.open("ab") as f:
        f.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")
    with pytest.raises(SessionCorrupt, match="nests too deeply"):
        verify_file(path)
