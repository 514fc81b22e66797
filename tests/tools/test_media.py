"""The media tools on their real backends (espeak-ng, ffmpeg/ffprobe, pocketsphinx), run as the agent's uid in its
workspace: a spoken phrase comes back as text, ffprobe's facts, and hostile paths, sizes and bytes refused with
nothing left running."""

from __future__ import annotations

import os
import shutil
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from covenant.home import Home

from .conftest import Tools, confined
from .test_process import marked_processes

MEDIA = ["rune@text-to-speech", "rune@speech-to-text", "rune@media-transcribe", "rune@media-describe"]


def _need_backends() -> None:
    for program, package in (("espeak-ng", "espeak-ng"), ("ffmpeg", "ffmpeg"), ("ffprobe", "ffmpeg")):
        if shutil.which(program) is None:
            pytest.skip(f"needs {program} (apt install {package})")
    pytest.importorskip("pocketsphinx", reason="needs pocketsphinx (pip install pocketsphinx, a covenant dependency)")


def media_tools(home: Home, **settings: object) -> AbstractAsyncContextManager[Tools]:
    """Tools whose agents run as uids of their own, their files confined (Landlock), under ``settings``. Needs root."""
    return confined(home, "media tools", **settings)


def _made(path: Path) -> Path:
    path.touch()
    return path


async def test_a_spoken_phrase_comes_back_as_text_and_ffprobe_describes_it(home: Home) -> None:
    _need_backends()
    async with media_tools(home) as tools:
        agent = tools.package("speaker", MEDIA)
        assert [t["function"]["name"] for t in tools.host.offered(agent)] == [
            "text-to-speech", "speech-to-text", "media-transcribe", "media-describe"], tools.host.unavailable(agent)
        ctx = tools.ctx(agent, tools.grant("tool.*"))
        workspace = tools.workspace(agent)

        spoken = await tools.host.call(ctx, "text-to-speech", {"text": "three four five six seven", "voice": "en-us",
                                                               "speed": 160, "path": "audio/count.wav"})
        assert spoken.ok, spoken
        wav = workspace / "audio" / "count.wav"
        data = wav.read_bytes()
        assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
        assert spoken.content["bytes"] == len(data) and spoken.content["media_type"] == "audio/wav"
        assert 1.0 < spoken.content["duration_s"] < 5.0
        assert wav.stat().st_uid == tools.runner.isolation.credentials_for(agent.id).uid  # written as the agent

        heard = await tools.host.call(ctx, "speech-to-text", {"path": "audio/count.wav"})
        assert heard.ok, heard
        assert {"three", "four", "five"} <= set(heard.content["text"].split()), heard.content
        assert heard.content["cut_at_s"] is None

        described = await tools.host.call(ctx, "media-describe", {"path": "./audio/count.wav"})
        assert described.ok, described
        assert described.content["format"]["format_name"] == "wav"
        [stream] = described.content["streams"]
        assert (stream["codec_type"], stream["codec_name"], stream["channels"]) == ("audio", "pcm_s16le", 1)
        assert stream["sample_rate"] == 22050 and 1.0 < stream["duration"] < 5.0
        assert [e["outcome"] for e in tools.audit.of("tool.call")] == ["ok", "ok", "ok"]
        assert marked_processes(ctx.intent_id) == []


async def test_hostile_paths_sizes_and_bytes_are_refused_and_nothing_is_left(home: Home) -> None:
    _need_backends()
    async with media_tools(home, tools={"media": {"input_max_bytes": 100_000, "text_max_chars": 50}}) as tools:
        agent = tools.package("hostile", MEDIA)
        ctx = tools.ctx(agent, tools.grant("tool.*"))
        workspace = tools.workspace(agent)
        uid = tools.runner.isolation.credentials_for(agent.id).uid
        (workspace / "notes.txt").write_bytes(b"not audio at all\n\x00\xff" * 100)
        os.truncate(_made(workspace / "huge.wav"), 50 * 1024 * 1024)  # sparse: over the cap without the disk
        (workspace / "out").symlink_to("/tmp")
        (workspace / "passwd").symlink_to("/etc/passwd")
        for name in ("notes.txt", "huge.wav"):
            os.chown(workspace / name, uid, uid)

        async def refused(tool: str, arguments: dict[str, object]) -> tuple[str | None, str]:
            result = await tools.host.call(ctx, tool, arguments)
            assert not result.ok, (tool, arguments, result)
            return result.error_code, result.error_message or ""

        assert (await refused("speech-to-text", {"path": "../../../etc/passwd"}))[0] == "path_refused"
        assert (await refused("media-describe", {"path": "/etc/passwd"}))[0] == "path_refused"
        code, message = await refused("media-describe", {"path": "passwd"})
        assert code == "path_refused" and "symlink" in message
        assert (await refused("text-to-speech", {"text": "hi", "path": "out/escape.wav"}))[0] == "path_refused"
        assert not os.path.exists("/tmp/escape.wav")
        code, message = await refused("media-transcribe", {"path": "huge.wav"})
        assert code == "file_too_large" and "input_max_bytes (100000)" in message
        code, message = await refused("speech-to-text", {"path": "notes.txt"})
        assert code == "media_unreadable" and "not audio" in message
        assert (await refused("media-describe", {"path": "notes.txt"}))[0] == "media_unreadable"
        assert (await refused("media-describe", {"path": "missing.ogg"}))[0] == "file_not_found"
        assert (await refused("media-describe", {"path": "."}))[0] == "wrong_file_type"
        code, message = await refused("text-to-speech", {"text": "x" * 51})
        assert code == "invalid_arguments" and "text_max_chars (50)" in message
        assert (await refused("text-to-speech", {"text": "hi", "voice": "en; rm -rf /"}))[0] == "invalid_arguments"
        assert len(tools.audit.of("tool.call")) == 11
        assert marked_processes(ctx.intent_id) == []


async def test_a_missing_backend_makes_only_its_tools_unavailable_with_the_fix(home: Home, tmp_path: object) -> None:
    """No espeak-ng where [tools.media] says, and an interpreter without pocketsphinx (the distribution's python3):
    text-to-speech and the transcribers are unavailable, saying what to install; media-describe is still offered.
    No [tools.media] images_provider: image-generate is unavailable, saying what to set."""
    if os.geteuid() != 0:
        pytest.skip("needs root for agent uids")
    if shutil.which("ffprobe") is None:
        pytest.skip("needs ffprobe (apt install ffmpeg)")
    async with media_tools(home, tools={"media": {"espeak": "/nonexistent/espeak-ng"}},
                           rune={"python": "/usr/bin/python3"}) as tools:
        agent = tools.package("partial", [*MEDIA, "rune@image-generate"])
        reasons = dict(tools.host.unavailable(agent))
        assert reasons["rune@image-generate"].startswith("needs [tools.media] images_provider"), reasons
        assert "apt-get install espeak-ng" in reasons["rune@text-to-speech"], reasons
        for name in ("rune@speech-to-text", "rune@media-transcribe"):
            assert "cannot import it" in reasons[name] and "pip install pocketsphinx" in reasons[name], reasons
        assert [t["function"]["name"] for t in tools.host.offered(agent)] == ["media-describe"]
