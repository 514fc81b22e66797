"""The adversarial list of design/audit-log.md: each edit is caught, at the right seq.

Layout of the sequential logs used here: seq 0 genesis, 1 its checkpoint,
then event k at seq 2k and its checkpoint at 2k+1 (k = 1..N).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.format import LINE_RE, build_line, canonical_object, parse_record, parse_record_full
from covenant.audit.verify import verify_log
from covenant.canonical import canonical_bytes, is_canonical_line
from covenant.home import Home
from covenant.keys import public_key_hex

from .conftest import pubkey_arg, read_lines, rechain, run_verify, segment, write_events_sync, write_lines


def _line_seq_at(lines: list[bytes], offset: int) -> int:
    pos = 0
    for i, line in enumerate(lines):
        if offset <= pos + len(line):  # the newline belongs to its line
            return i
        pos += len(line) + 1
    raise AssertionError("offset past the end")


@pytest.fixture
def small_log(tmp_path: Path, key: Ed25519PrivateKey) -> Path:
    directory = tmp_path / "audit"
    write_events_sync(directory, key, sequential=3, concurrent=3)
    return directory


def test_clean_log_verifies_and_cli_exits_0(home_with_key: tuple[Home, Ed25519PrivateKey]) -> None:
    home, key = home_with_key
    write_events_sync(home.audit_dir, key, sequential=3, concurrent=5)
    report = verify_log(home.audit_dir, key.public_key())
    assert report.ok and report.first_problem is None and report.warnings == []
    assert report.records == 2 + 3 * 2 + 5 + 1
    code, out = run_verify(home)  # key pinned from identity/daemon.key
    assert code == 0, out
    assert out.startswith("ok: 14 records")


def test_every_single_byte_flip_is_caught_at_its_line(small_log: Path, key: Ed25519PrivateKey) -> None:
    path = segment(small_log)
    original = path.read_bytes()
    lines = read_lines(path)
    for offset in range(len(original)):
        for mask in (0x01, 0x80) if offset % 7 == 0 else (0x01,):
            flipped = bytearray(original)
            flipped[offset] ^= mask
            path.write_bytes(bytes(flipped))
            report = verify_log(small_log, key.public_key())
            assert not report.ok, f"flip {mask:#x} at byte {offset} not detected"
            assert report.first_problem is not None
            assert report.first_problem.seq == _line_seq_at(lines, offset), (offset, mask, report.first_problem)
    path.write_bytes(original)
    assert verify_log(small_log, key.public_key()).ok


def test_flip_that_keeps_valid_canonical_json(small_log: Path, key: Ed25519PrivateKey, home: Home) -> None:
    path = segment(small_log)
    lines = read_lines(path)
    assert b'"intent":"i1"' in lines[4]
    lines[4] = lines[4].replace(b'"intent":"i1"', b'"intent":"i9"')
    assert is_canonical_line(lines[4])
    write_lines(path, lines)
    report = verify_log(small_log, key.public_key())
    assert not report.ok and report.first_problem.seq == 4
    assert report.first_problem.offset == sum(len(x) + 1 for x in lines[:4])
    home.audit_dir.parent.mkdir(exist_ok=True)
    small_log.rename(home.audit_dir)
    code, out = run_verify(home, *pubkey_arg(key))
    assert code == 1 and "seq 4," in out and "audit-000000.jsonl" in out


@pytest.mark.parametrize("update_checkpoint_hash", [False, True])
def test_edit_and_rechain_every_later_prev(
    small_log: Path, key: Ed25519PrivateKey, update_checkpoint_hash: bool
) -> None:
    path = segment(small_log)
    lines = read_lines(path)
    lines[4] = lines[4].replace(b'"outcome":"ok"', b'"outcome":"no"')
    lines = rechain(lines, 5)
    if update_checkpoint_hash:  # the attacker also fixes the covered hash; the signature then fails
        rec = json.loads(lines[5])
        rec["data"]["hash"] = rec["prev"]
        lines[5] = canonical_bytes(rec)
        lines = rechain(lines, 6)
    write_lines(path, lines)
    report = verify_log(small_log, key.public_key())
    assert not report.ok
    assert report.first_problem.seq == 5  # the checkpoint covering the edited record
    expected = "signature" if update_checkpoint_hash else "cover"
    assert expected in report.first_problem.message


def test_edit_inside_a_batch_and_rechain(small_log: Path, key: Ed25519PrivateKey) -> None:
    path = segment(small_log)
    lines = read_lines(path)
    first_batch = next(i for i, x in enumerate(lines) if b'"agent":"batch"' in x)
    lines[first_batch] = lines[first_batch].replace(b'"agent":"batch"', b'"agent":"other"')
    lines = rechain(lines, first_batch + 1)
    write_lines(path, lines)
    report = verify_log(small_log, key.public_key())
    assert not report.ok
    assert report.first_problem.seq == len(lines) - 1  # the batch's one checkpoint is the last line


def test_delete_a_record(small_log: Path, key: Ed25519PrivateKey) -> None:
    path = segment(small_log)
    lines = read_lines(path)
    write_lines(path, lines[:4] + lines[5:])
    report = verify_log(small_log, key.public_key())
    assert not report.ok and report.first_problem.seq == 4
    assert "missing" in report.first_problem.message


def test_delete_a_checkpoint_line(small_log: Path, key: Ed25519PrivateKey) -> None:
    path = segment(small_log)
    lines = read_lines(path)
    assert parse_record(lines[5])[0]["type"] == "audit.checkpoint"
    write_lines(path, lines[:5] + lines[6:])
    report = verify_log(small_log, key.public_key())
    assert not report.ok and report.first_problem.seq == 5


@pytest.mark.parametrize(("a", "b"), [(4, 5), (4, 6)])
def test_swap_two_records(small_log: Path, key: Ed25519PrivateKey, a: int, b: int) -> None:
    path = segment(small_log)
    lines = read_lines(path)
    lines[a], lines[b] = lines[b], lines[a]
    write_lines(path, lines)
    report = verify_log(small_log, key.public_key())
    assert not report.ok and report.first_problem.seq == a


def test_duplicate_a_line(small_log: Path, key: Ed25519PrivateKey) -> None:
    path = segment(small_log)
    lines = read_lines(path)
    write_lines(path, lines[:5] + [lines[4]] + lines[5:])
    report = verify_log(small_log, key.public_key())
    assert not report.ok and report.first_problem.seq == 5
    assert "repeated" in report.first_problem.message


def _variants(line: bytes) -> dict[str, bytes]:
    assert line.startswith(b'{"data":{"agent":"echo"')
    return {
        "duplicate key": line.replace(b'{"data":{"agent":"echo"', b'{"data":{"agent":"echo","agent":"echo"', 1),
        "duplicate top-level key": line.replace(b',"v":1}', b',"v":1,"v":1}'),
        "float": line.replace(b'"n":1', b'"n":1.0'),
        "float that re-encodes the same": line.replace(b'"n":1', b'"n":1.5'),
        "exponent": line.replace(b'"n":1', b'"n":1e0'),
        "NaN": line.replace(b'"n":1', b'"n":NaN'),
        "Infinity": line.replace(b'"n":1', b'"n":Infinity'),
        "BOM": b"\xef\xbb\xbf" + line,
        "CRLF": line + b"\r",
        "NUL": line.replace(b'"echo"', b'"ec\x00ho"', 1),
        "invalid UTF-8": line.replace(b'"echo"', b'"ec\xffho"', 1),
        "overlong UTF-8": line.replace(b'"echo"', b'"ec\xc0\xafho"', 1),
        "escaped ASCII": line.replace(b'"echo"', b'"\\u0065cho"', 1),
        "space": line.replace(b'{"data":', b'{"data": ', 1),
        "unsorted keys": line.replace(b'{"agent":"echo","intent":"i1"', b'{"intent":"i1","agent":"echo"', 1),
        "negative zero": line.replace(b'"n":1', b'"n":-0'),
        "escaped slash": line.replace(b'"echo"', b'"ec\\/ho"', 1),
    }


@pytest.mark.parametrize("name", sorted(_variants(b'{"data":{"agent":"echo","intent":"i1","n":1}}')))
def test_non_canonical_encodings_are_rejected(small_log: Path, key: Ed25519PrivateKey, name: str) -> None:
    path = segment(small_log)
    lines = read_lines(path)
    variant = _variants(lines[4])[name]
    assert variant != lines[4]
    assert not is_canonical_line(variant)
    write_lines(path, lines[:4] + [variant] + lines[5:])
    report = verify_log(small_log, key.public_key())
    assert not report.ok
    assert report.first_problem.seq == 4, report.first_problem


def test_cut_mid_line_then_recovery(small_log: Path, key: Ed25519PrivateKey) -> None:
    path = segment(small_log)
    lines = read_lines(path)
    data = path.read_bytes()
    cut = len(data) - len(lines[-1]) // 2
    path.write_bytes(data[:cut])
    report = verify_log(small_log, key.public_key())
    assert not report.ok and report.first_problem.seq == len(lines) - 1
    assert "unterminated" in report.first_problem.message
    write_events_sync(small_log, key, sequential=1)  # reopening recovers, then writes on
    report = verify_log(small_log, key.public_key())
    assert report.ok, report.first_problem
    recovered = [parse_record(x)[0] for x in read_lines(path) if b"audit.recover" in x]
    assert len(recovered) == 1
    # The batch was cut inside its checkpoint: its records were never acknowledged and are discarded.
    first_batch = next(i for i, x in enumerate(lines) if b'"agent":"batch"' in x)
    assert recovered[0]["seq"] == first_batch
    assert recovered[0]["data"]["valid_bytes"] == sum(len(x) + 1 for x in lines[:first_batch])


def test_cut_after_the_last_checkpoint_leaves_uncovered_records(small_log: Path, key: Ed25519PrivateKey) -> None:
    path = segment(small_log)
    lines = read_lines(path)
    write_lines(path, lines[:-1])  # drop the final checkpoint: the batch before it is uncovered
    report = verify_log(small_log, key.public_key())
    first_batch = next(i for i, x in enumerate(lines) if b'"agent":"batch"' in x)
    assert not report.ok and report.first_problem.seq == len(lines) - 2  # the last line left
    assert f"from seq {first_batch} are not covered" in report.first_problem.message


def test_cut_exactly_at_a_checkpoint(home_with_key: tuple[Home, Ed25519PrivateKey], tmp_path: Path) -> None:
    home, key = home_with_key
    write_events_sync(home.audit_dir, key, sequential=6)
    witness = tmp_path / "witness.json"
    from click.testing import CliRunner

    from covenant.cli.group import cli

    result = CliRunner().invoke(cli, ["--home", str(home.root), "audit", "head"])
    assert result.exit_code == 0
    witness.write_text(result.stdout)
    assert json.loads(result.stdout)["seq"] == 12
    path = segment(home.audit_dir)
    lines = read_lines(path)
    write_lines(path, lines[:10])  # ends with seq 9, the checkpoint of event 4 (seq 8)

    # head.json still in place: it names seq 12, which the log no longer has.
    code, out = run_verify(home)
    assert code == 1 and "seq 12," in out and "truncated" in out

    # A root attacker also removes head.json: without a witness the cut is undetectable.
    (home.audit_dir / "head.json").unlink()
    code, out = run_verify(home)
    assert code == 0, out
    assert "head.json is missing" in out

    # With the witness kept elsewhere it is a hard failure.
    code, out = run_verify(home, "--witness", str(witness))
    assert code == 1 and "seq 12," in out and "witness" in out


def test_witness_from_another_log_or_forged(home_with_key: tuple[Home, Ed25519PrivateKey], tmp_path: Path) -> None:
    home, key = home_with_key
    write_events_sync(home.audit_dir, key, sequential=2)
    head = json.loads((home.audit_dir / "head.json").read_text())
    code, _ = run_verify(home, "--witness", str(home.audit_dir / "head.json"))
    assert code == 0
    forged = dict(head, seq=head["seq"] - 2)
    (tmp_path / "w.json").write_text(json.dumps(forged))
    code, out = run_verify(home, "--witness", str(tmp_path / "w.json"))
    assert code == 1 and "signature" in out


def test_replaced_public_key_in_the_log_is_not_trusted(
    home_with_key: tuple[Home, Ed25519PrivateKey], tmp_path: Path
) -> None:
    home, key = home_with_key
    write_events_sync(home.audit_dir, key, sequential=3)
    # The attacker rewrites the whole log, signed by a key of their own (a consistent forgery).
    attacker = Ed25519PrivateKey.generate()
    forged_dir = tmp_path / "forged"
    write_events_sync(forged_dir, attacker, sequential=2)
    for p in home.audit_dir.iterdir():
        p.unlink()
    for p in forged_dir.iterdir():
        (home.audit_dir / p.name).write_bytes(p.read_bytes())
    assert verify_log(home.audit_dir, attacker.public_key()).ok  # consistent in itself...

    code, out = run_verify(home)  # ...but verify pins identity/daemon.key
    assert code == 1 and "seq 0," in out and public_key_hex(attacker) in out
    code, out = run_verify(home, *pubkey_arg(key))
    assert code == 1 and "seq 0," in out

    # Even if the attacker also swaps identity/daemon.key, audit.pubkey in covenant.toml pins the real one.
    home.config_path.write_text(f'[audit]\npubkey = "{public_key_hex(key)}"\n')
    home.daemon_key_path.unlink()
    home.daemon_key_path.write_bytes(b"")
    code, out = run_verify(home)
    assert code == 1 and "seq 0," in out


def test_fast_parser_agrees_with_is_canonical_line() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    tricky = st.sampled_from(['","prev":"', '"}', "}", "\\", '"', "\n", "\u2028", "é", "\x00", '{"data":', ',"v":1}'])
    text = st.text(max_size=8) | tricky | st.lists(tricky, max_size=3).map("".join)
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | text | st.floats(allow_nan=True),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
        max_leaves=8,
    )
    types = st.sampled_from(["a.b", "audit.checkpoint", "audit.heartbeat", "intent.received", "x_1.y.z"])

    @settings(max_examples=400, deadline=None)
    @given(json_values, st.sampled_from([b"", b" ", b"\r", b"\xef\xbb\xbf"]), st.integers(0, 10**20), types)
    def check(value: object, noise: bytes, seq: int, type_: str) -> None:
        record = {"data": {"x": value}, "prev": "0" * 64, "seq": seq, "ts": "2026-01-01T00:00:00.000Z", "type": type_, "v": 1}
        try:
            line = canonical_bytes(record)
        except (ValueError, UnicodeEncodeError):
            return
        # The writer's layout always takes the fast path, and it proves exactly the canonical encoding.
        built = build_line(type_, canonical_bytes(record["data"]), record["prev"], seq, record["ts"])
        assert built == line
        match = LINE_RE.fullmatch(line)
        assert match is not None
        if is_canonical_line(line):  # not so for floats, which the record layout refuses
            assert canonical_object(match.group(1)) == record["data"]
        for candidate in (
            line,
            noise + line,
            line.replace(b":", b": ", 1),
            line + noise,
            line.replace(b'"seq":', b'"seq":0', 1),
            line.replace(b'"data":{', b'"data":{"x":0,', 1),
            line.replace(b"}", b" }", 1),
        ):
            fast, why = parse_record(candidate)
            full, full_why = parse_record_full(candidate)
            assert fast == full and why == full_why, candidate
            assert (fast is not None) == is_canonical_line(candidate), candidate

    check()
