"""Image parts of a model request: only inline PNG/JPEG/GIF/WebP data URLs in user turns pass the gateway's check,
OpenAI-compatible providers get them as sent, Anthropic ones as base64 image blocks; images known by their bytes."""

from __future__ import annotations

import pytest

from covenant.models.anthropic import to_anthropic
from covenant.models.types import ModelError
from covenant.models.validate import check_request
from covenant.tools.builtins.images import image_type

PIXEL = "iVBORw0KGgo="


def _turn(url: str, role: str = "user") -> list[dict]:
    return [{"role": role, "content": [{"type": "text", "text": "what is it?"},
                                       {"type": "image_url", "image_url": {"url": url}}]}]


def test_an_inline_image_in_a_user_turn_passes_and_becomes_an_anthropic_image_block() -> None:
    messages = _turn(f"data:image/png;base64,{PIXEL}")
    check_request(messages, [])
    system, out = to_anthropic(messages)
    assert system == "" and out == [{"role": "user", "content": [
        {"type": "text", "text": "what is it?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}},
    ]}]


@pytest.mark.parametrize(("url", "role"), [
    ("https://example.com/cat.png", "user"),  # the provider would fetch it from wherever the sender chose
    ("data:image/svg+xml;base64,PHN2Zz4=", "user"),
    ("data:image/png;base64,not base64!", "user"),
    (f"data:image/png;base64,{PIXEL}", "system"),
    (f"data:image/png;base64,{PIXEL}", "tool"),
])
def test_any_other_image_part_is_a_protocol_error(url: str, role: str) -> None:
    messages = _turn(url, role)
    if role == "tool":
        messages[0]["tool_call_id"] = "c1"
    with pytest.raises(ModelError) as refused:
        check_request(messages, [])
    assert refused.value.code == "protocol_error" and "messages[0].content[1]" in refused.value.message


@pytest.mark.parametrize(("data", "expected"), [
    (b"\x89PNG\r\n\x1a\n....", "image/png"),
    (b"\xff\xd8\xff\xe0JFIF", "image/jpeg"),
    (b"GIF89a\x01\x00", "image/gif"),
    (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "image/webp"),
    (b"RIFF\x10\x00\x00\x00WAVEfmt ", None),
    (b"<svg xmlns='http://www.w3.org/2000/svg'/>", None),
    (b"", None),
])
def test_images_are_known_by_their_first_bytes(data: bytes, expected: str | None) -> None:
    assert image_type(data) == expected
