"""rune@canvas-present through a real daemon: the content kept as artifacts of the intent, listed in its record,
saved by `covenant show ID --save DIR`, and returned to an A2A caller as file parts."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import zlib
from pathlib import Path

import pytest

from covenant.client import RemoteError

from tests.a2a.conftest import message_params, rpc, serve_a2a
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of


def _png() -> bytes:
    """A real 1x1 PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


MARKDOWN = "# Quarterly\n\n| q | n |\n|---|---|\n| 1 | 7 |\n"


def test_canvas_content_is_kept_saved_and_served_as_a2a_file_parts(
    daemon: DaemonProcess, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    configure(daemon, ("fake", fake_model))
    add_rune_agent(daemon, "painter", toolset=("rune@canvas-present",))
    served = serve_a2a(daemon, expose=("painter",), before=(daemon.home / "covenant.toml").read_text()
                       + "\n[tools.artifacts]\nmax_files = 2\n")
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.canvas_present", check=True)
    png = _png()
    fake_model.script(
        Reply.tools(ToolCall("canvas-present", {"content": MARKDOWN, "title": "Quarterly report"}),
                    ToolCall("canvas-present", {"content": base64.b64encode(png).decode(), "format": "png"})),
        Reply.tools(ToolCall("canvas-present", {"content": "bm90IGEgcG5n", "format": "png"})),  # "not a png"
        Reply.tools(ToolCall("canvas-present", {"content": "one too many"})),
        Reply(text="Presented."),
    )
    result = daemon.cli("dispatch", "draw it", "--agent", "painter@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["outcome"] == "ok", outcome
    answers = [json.loads(m["content"]) for m in fake_model.requests[3].messages if m["role"] == "tool"]
    assert sorted(a["artifact"]["name"] for a in answers[:2]) == ["Quarterly-report.md", "canvas.png"]
    assert answers[2]["error"]["code"] == "artifact_refused" and "not a PNG" in answers[2]["error"]["message"]
    assert answers[3]["error"]["code"] == "artifact_refused" and "max_files" in answers[3]["error"]["message"]
    intent = outcome["intent_id"]
    record = daemon.api("GET", f"/v1/dispatches/{intent}")
    assert sorted(record["artifacts"], key=lambda a: a["name"]) == [
        {"name": "Quarterly-report.md", "media_type": "text/markdown", "bytes": len(MARKDOWN.encode()),
         "sha256": hashlib.sha256(MARKDOWN.encode()).hexdigest()},
        {"name": "canvas.png", "media_type": "image/png", "bytes": len(png), "sha256": hashlib.sha256(png).hexdigest()},
    ]

    shown = daemon.cli("show", intent, "--save", str(tmp_path / "out"), check=True).stdout
    assert "artifact  canvas.png  image/png" in shown and f"saved {tmp_path / 'out' / 'canvas.png'}" in shown
    assert (tmp_path / "out" / "Quarterly-report.md").read_text() == MARKDOWN
    assert (tmp_path / "out" / "canvas.png").read_bytes() == png
    (tmp_path / "out" / "canvas.png").write_bytes(b"mine")
    again = daemon.cli("show", intent, "--save", str(tmp_path / "out"))
    assert again.returncode == 1 and "exists already; not overwritten" in again.stderr
    assert (tmp_path / "out" / "canvas.png").read_bytes() == b"mine"
    for name in ("nope.png", "..%2F..%2Fidentity%2Fdaemon.key"):
        with pytest.raises(RemoteError) as missing:
            daemon.api("GET", f"/v1/dispatches/{intent}/artifacts/{name}")
        assert missing.value.code == "not_found"

    # A changed file in the store is refused, not served.
    stored = daemon.home / "state" / "artifacts" / intent / "files" / "canvas.png"
    stored.write_bytes(png + b"tampered")
    bad = daemon.cli("show", intent, "--save", str(tmp_path / "elsewhere"))
    assert bad.returncode == 1 and "does not match its sha256" in bad.stderr
    stored.write_bytes(png)

    fake_model.script(Reply.tools(ToolCall("canvas-present", {"content": "<p>hi</p>", "format": "html"})),
                      Reply(text="Shown."))
    answer = rpc(served, "painter", "SendMessage", message_params("show me")).json()["result"]["task"]
    assert answer["status"]["state"] == "TASK_STATE_COMPLETED", answer
    text, file = answer["artifacts"]
    assert text["parts"] == [{"text": "Shown."}]
    assert file["parts"] == [{"raw": base64.b64encode(b"<p>hi</p>").decode(), "mediaType": "text/html",
                              "filename": "canvas.html"}]
    got = rpc(served, "painter", "GetTask", {"id": answer["id"]}).json()["result"]
    assert got["artifacts"] == answer["artifacts"]
    fake_model.script(Reply.tools(ToolCall("canvas-present", {"content": "plain", "format": "text", "title": "x"})),
                      Reply(text="Done."))
    old = rpc(served, "painter", "message/send", {"message": {
        "kind": "message", "messageId": "m1", "role": "user", "parts": [{"kind": "text", "text": "old style"}]}})
    assert old.json()["result"]["artifacts"][1]["parts"] == [  # A2A 0.3's file part
        {"kind": "file", "file": {"name": "x.txt", "mimeType": "text/plain", "bytes": base64.b64encode(b"plain").decode()}}]
    assert daemon.stop() == 0
