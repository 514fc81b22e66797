"""rune@image-generate and rune@image-analyze through a real daemon and the fake provider: the image made by the
provider's images endpoint lands in the agent's workspace, and the agent's model receives it as an image part of
one more model call (the same agent's provider, the intent's budget, a model.call event); `covenant tools list` says
which media tools this host offers and why not."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import shutil
import zlib

import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of

TOOLSET = ("rune@image-generate", "rune@image-analyze", "rune@media-describe", "rune@file-write", "rune@text-to-speech")


def _png() -> bytes:
    """A real 1x1 PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


def _tool_answers(request) -> list[dict]:  # type: ignore[no-untyped-def]
    return [json.loads(m["content"]) for m in request.messages if m["role"] == "tool"]


def test_a_generated_image_is_saved_and_the_model_is_shown_it(daemon: DaemonProcess, fake_model: FakeModelServer) -> None:
    if shutil.which("ffprobe") is None:
        pytest.skip("needs ffprobe (apt install ffmpeg) for media-describe")
    configure(daemon, ("fake", fake_model), extra='[tools.media]\nimages_provider = "fake"\nimages_model = "painter-1"\n'
                                                 "image_max_bytes = 4096\n")
    add_rune_agent(daemon, "artist", toolset=TOOLSET)
    daemon.start()
    listed = {t["entry"]: t for t in json.loads(daemon.cli("tools", "list", "artist", "--json", check=True).stdout)["tools"]}
    assert listed["rune@image-generate"]["available"] is True and listed["rune@image-analyze"]["available"] is True, listed
    speech = listed["rune@text-to-speech"]  # offered where espeak-ng is installed, else the command that installs it
    assert speech["available"] is True or "apt-get install espeak-ng" in speech["reason"], speech
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    png = _png()
    workspace = daemon.home / "state" / "workspaces" / "artist@local"
    fake_model.script(
        Reply.tools(ToolCall("image-generate", {"prompt": "a red dot", "path": "art/dot.png", "size": "256x256"}),
                    ToolCall("file-write", {"path": "notes.txt", "content": "not an image"}),
                    ToolCall("file-write", {"path": "big.png", "content": "x" * 5000})),
        Reply(image=png),  # the images endpoint
        Reply.tools(ToolCall("image-analyze", {"path": "art/dot.png", "prompt": "What colour is it?"}),
                    ToolCall("image-analyze", {"path": "../../../identity/daemon.key"}),
                    ToolCall("image-analyze", {"path": "notes.txt"}),
                    ToolCall("image-analyze", {"path": "big.png"})),
        Reply(text="A single red pixel."),  # image-analyze's own model call
        Reply.tools(ToolCall("media-describe", {"path": "art/dot.png"})),
        Reply(text="A red dot."),  # media-describe's, for an image
        Reply(text="It is red."),
    )
    result = daemon.cli("dispatch", "paint and look", "--agent", "artist@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["outcome"] == "ok" and outcome["text"] == "It is red.", outcome

    images = fake_model.requests[1]
    assert images.path.endswith("/images/generations"), images.path
    assert images.body == {"model": "painter-1", "prompt": "a red dot", "n": 1, "response_format": "b64_json",
                           "size": "256x256"}
    assert images.headers["authorization"].startswith("Bearer ")
    made, written, _ = _tool_answers(fake_model.requests[2])
    assert written["bytes"] == len("not an image"), written
    assert made == {"path": "art/dot.png", "media_type": "image/png", "bytes": len(png),
                    "sha256": hashlib.sha256(png).hexdigest(), "provider": "fake", "model": "painter-1"}
    assert (workspace / "art" / "dot.png").read_bytes() == png

    # image-analyze's model call: the agent's provider, one user turn holding the question and the image part.
    [turn] = fake_model.requests[3].messages
    assert turn["role"] == "user" and fake_model.requests[3].body.get("tools") in (None, [])
    assert turn["content"] == [{"type": "text", "text": "What colour is it?"},
                               {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}]
    analyzed, escaped, not_image, too_big = _tool_answers(fake_model.requests[4])[3:]
    assert analyzed == {"path": "art/dot.png", "media_type": "image/png", "bytes": len(png), "analysis": "A single red pixel."}
    assert escaped["error"]["code"] == "path_refused", escaped
    assert not_image["error"]["code"] == "media_unreadable" and "not a PNG" in not_image["error"]["message"], not_image
    assert too_big["error"]["code"] == "file_too_large" and "image_max_bytes (4096)" in too_big["error"]["message"]
    [described] = _tool_answers(fake_model.requests[6])[7:]
    assert described["description"] == "A red dot." and described["format"]["format_name"] == "png_pipe", described
    assert (described["streams"][0]["width"], described["streams"][0]["height"]) == (1, 1)
    assert fake_model.requests[5].messages[0]["content"][1]["type"] == "image_url"
    tail = daemon.cli("audit", "tail", "--json", "-n", "1000", "--type", "model.call", check=True).stdout.splitlines()
    calls = [json.loads(line)["data"] for line in tail]
    calls = [c for c in calls if c["intent"] == outcome["intent_id"]]
    assert [(c["model"], c["outcome"]) for c in calls][1] == ("painter-1", "ok") and len(calls) == 7, calls
