"""safety_policy redaction: key values, PEM private keys and token shapes; streamed a line at a time, or (none) a
delta at a time less a possible key start."""

from __future__ import annotations

from covenant.rune.safety import REDACTED, LineRedactor, ValueRedactor, redact, still_secret

KEY = "provider-key-value-1234567890"
PEM = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ+abc\n-----END PRIVATE KEY-----"


def test_redact_values_and_shapes() -> None:
    text = f"key {KEY}, openai sk-proj-{'a' * 30}, aws AKIAABCDEFGHIJKLMNOP, pem:\n{PEM}\nbye"
    out = redact(text, [KEY])
    assert KEY not in out and "sk-proj" not in out and "AKIA" not in out and "BEGIN PRIVATE KEY" not in out
    assert out.startswith(f"key {REDACTED}, openai {REDACTED}") and out.endswith("bye")
    assert not still_secret(out, [KEY]) and still_secret(text, [KEY])
    assert redact(f"only {KEY}", [KEY], patterns=False) == f"only {REDACTED}"
    assert redact(f"sk-{'b' * 30}", [KEY], patterns=False) == f"sk-{'b' * 30}"  # shapes only with patterns
    assert redact("short secret abc", ["abc"]) == "short secret abc"  # values under 8 characters are noise


def test_line_redactor_holds_back_only_the_current_line() -> None:
    redactor = LineRedactor([KEY])
    pieces = ["hello wor", "ld\nthe key is prov", "ider-key-value-12", "34567890 ok\n", "tail"]
    outputs = [redactor.feed(p) for p in pieces]
    assert outputs == ["", "hello world\n", "", f"the key is {REDACTED} ok\n", ""]
    assert redactor.flush() == "tail"


def test_line_redactor_withholds_a_whole_pem_block() -> None:
    redactor = LineRedactor([])
    streamed = "".join(redactor.feed(c) for c in f"before\n{PEM}\nafter\n") + redactor.flush()
    assert streamed == f"before\n{REDACTED}\nafter\n"


def _streamed(redactor: ValueRedactor, pieces: list[str]) -> tuple[list[str], str]:
    return [redactor.feed(p) for p in pieces], redactor.flush()


def test_value_redactor_passes_each_piece_on_at_once() -> None:
    """safety_policy none: nothing that cannot begin a key value is held back, not even a partial line."""
    outputs, rest = _streamed(ValueRedactor([KEY]), ["Tick", " tock,", " it is", " noon"])
    assert outputs == ["Tick", " tock,", " it is", " noon"] and rest == ""
    outputs, rest = _streamed(ValueRedactor([]), ["no keys", " configured: ", "pr"])
    assert outputs == ["no keys", " configured: ", "pr"] and rest == ""


def test_value_redactor_catches_a_key_split_anywhere() -> None:
    text = f"the key is {KEY}, twice: {KEY}{KEY}. end"
    expected = f"the key is {REDACTED}, twice: {REDACTED}{REDACTED}. end"
    for size in (1, 2, 3, 5, 7, 11):
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        outputs, rest = _streamed(ValueRedactor([KEY]), pieces)
        assert "".join(outputs) + rest == expected, size
    for cut in range(1, len(text)):  # every single split point
        outputs, rest = _streamed(ValueRedactor([KEY]), [text[:cut], text[cut:]])
        assert "".join(outputs) + rest == expected, cut


def test_value_redactor_holds_only_a_possible_key_start_and_releases_it() -> None:
    redactor = ValueRedactor([KEY])
    assert redactor.feed("call provider-") == "call "  # "provider-" may be the key's beginning
    assert redactor.feed("friendly people") == "provider-friendly people"  # it was not
    assert redactor.feed(" prov") == " "
    assert redactor.flush() == "prov"


def test_value_redactor_never_splits_a_key_inside_another() -> None:
    """A key that repeats its own beginning, and a key that begins with another whole key."""
    short, longer = "abcabcab", "abcabcab-and-more"
    for keys, text in (([short], "xx abcabcab yy"), ([short, longer], "x abcabcab-and-more y abcabcab z")):
        for size in (1, 2, 3, 4):
            pieces = [text[i:i + size] for i in range(0, len(text), size)]
            outputs, rest = _streamed(ValueRedactor(keys), pieces)
            assert "".join(outputs) + rest == redact(text, keys, patterns=False), (keys, size)
            assert not any(k in "".join(outputs) + rest for k in keys)
