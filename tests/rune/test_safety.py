"""safety_policy redaction: key values, PEM private keys and token shapes; streamed a line at a time."""

from __future__ import annotations

from covenant.rune.safety import REDACTED, LineRedactor, redact, still_secret

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
