"""``rune@text-to-speech``, ``rune@speech-to-text``, ``rune@media-transcribe`` and ``rune@media-describe``.

Each call is one run of :mod:`covenant.tools.media_runner` through the runner's tool mode
(:meth:`~covenant.runtime.runner.Runner.run_tool`): the agent's uid, its limits, no network, the
agent's workspace as its working directory and the only place it may write (Landlock where the host
has it), never the daemon process. The runner speaks with espeak-ng, decodes with ffmpeg, transcribes
with pocketsphinx's bundled English model and probes with ffprobe; the daemon only checks the
arguments, builds the request and reads the answer. Files stay in the workspace, capped by
``[tools.media]``. media-describe of a still image also asks the agent's model what it shows, as
``rune@image-analyze`` does (:mod:`covenant.tools.builtins.images`).
"""

from __future__ import annotations

import json
import math
import secrets
from typing import Any

import trio

from covenant.config import Config
from covenant.runtime.tool_files import ToolFiles
from covenant.tools.beneath import Escape, split_relative
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.builtins.images import ask_about_image, read_image
from covenant.tools.media_backend import media_backend, media_problem, program
from covenant.tools.runner_python import RunnerCommand
from covenant.tools.result import ToolError, runner_answer

__all__ = ["TOOLS"]

_PATH = {"type": "string", "minLength": 1, "maxLength": 4096, "description": "a file in your workspace (relative path)"}
_RUNNER_SLACK_S = 1.0
"""The runner's own programs stop this much before the run is killed, so the model is told which one was slow."""


def _timeout_ms(config: Config, arguments: dict[str, Any]) -> int:
    # The run is stopped at [tools.media] timeout_ms; the host's deadline comes after the kill ladder.
    return config.tools.media.timeout_ms + config.runtime.kill_grace_ms + 1000


def _checked_path(path: str) -> str:
    """The path as the workspace-relative one the runner opens; an absolute or climbing one is refused here
    already (the runner's walk, which never follows a symlink, is what enforces it)."""
    try:
        parts = split_relative(path)
    except Escape as exc:
        raise ToolError("path_refused", str(exc)) from None
    if not parts:
        raise ToolError("wrong_file_type", f"{path!r} is the workspace itself, not a file")
    return "/".join(parts)


async def _backend(config: Config) -> RunnerCommand:
    backend = await trio.to_thread.run_sync(media_backend, config)
    if isinstance(backend, str):
        raise ToolError("tool_unavailable", backend)
    return backend


async def _run(call: BuiltinCall, request: dict[str, Any]) -> dict[str, Any]:
    """One run of the media runner as the agent; its ``ok`` document, or its error raised as a ToolError."""
    config = call.services.config
    backend = await _backend(config)
    workspace = await trio.to_thread.run_sync(call.services.workspace, call.ctx.agent.id)
    left_ms = (call.ends - trio.current_time()) * 1000 if math.isfinite(call.ends) else math.inf
    wall_ms = int(min(config.tools.media.timeout_ms, left_ms))
    if wall_ms <= 0:
        raise ToolError("tool_timeout", "the intent has no time left for the media tool")
    root = str(workspace.root)
    files = call.services.runner.tool_confinement.where_possible(ToolFiles(read_only=backend.read_only, read_write=(root,)))
    request = {**request, "timeout_s": max(0.5, wall_ms / 1000 - _RUNNER_SLACK_S)}
    document = json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    run = await call.services.runner.run_tool(
        call.ctx.agent, backend.prefix, document, run_id=call.ctx.run_marker(), wall_ms=wall_ms, network="off",
        cwd=root, files=files, priority=call.ctx.priority,
    )
    match run.outcome:
        case "ok":
            pass
        case "timeout":
            raise ToolError("tool_timeout", f"the media tool did not finish in time and was killed: {run.error}")
        case "spawn_failed":
            raise ToolError("tool_unavailable", f"the media runner could not be started: {run.error}")
        case _:
            raise ToolError("tool_failed", f"the media runner was stopped ({run.outcome}): {run.error}")
    return runner_answer(run.result, "media runner")


def _programs(config: Config, *names: str) -> dict[str, str]:
    found = {name: program(config, name) for name in names}
    missing = [name for name, path in found.items() if path is None]
    if missing:  # installed or removed since the toolset was resolved
        raise ToolError("tool_unavailable", media_problem(config, tuple(missing)) or f"{missing[0]} is missing")
    return {name: str(path) for name, path in found.items()}


async def _speak(call: BuiltinCall) -> dict[str, Any]:
    config = call.services.config
    text = call.arguments["text"]
    if len(text) > config.tools.media.text_max_chars:
        raise ToolError("invalid_arguments", f"the text is {len(text)} characters, more than [tools.media] text_max_chars "
                                             f"({config.tools.media.text_max_chars}); say it in parts")
    path = _checked_path(call.arguments.get("path") or f"speech-{secrets.token_hex(4)}.wav")
    return await _run(call, {
        "op": "speak", "text": text, "path": path, "voice": call.arguments.get("voice"),
        "speed": call.arguments.get("speed"), "max_bytes": config.tools.media.output_max_bytes,
        "espeak": _programs(config, "espeak")["espeak"],
    })


async def _transcribe(call: BuiltinCall) -> dict[str, Any]:
    config = call.services.config
    return await _run(call, {
        "op": "transcribe", "path": _checked_path(call.arguments["path"]), "max_bytes": config.tools.media.input_max_bytes,
        "max_audio_s": config.tools.media.audio_max_s, "ffmpeg": _programs(config, "ffmpeg")["ffmpeg"],
    })


_STILL_IMAGES = frozenset({"png", "mjpeg", "gif", "webp"})
"""ffprobe's codec names of the images the agent's model may be shown (media-describe then asks it)."""


async def _describe(call: BuiltinCall) -> dict[str, Any]:
    config = call.services.config
    facts = await _run(call, {
        "op": "describe", "path": _checked_path(call.arguments["path"]), "max_bytes": config.tools.media.input_max_bytes,
        "ffprobe": _programs(config, "ffprobe")["ffprobe"],
    })
    streams = facts.get("streams") or []
    if call.ctx.models is not None and len(streams) == 1 and streams[0].get("codec_name") in _STILL_IMAGES:
        # An image: the agent's model says what it shows, when it accepts images (its refusal is a note, not a failure).
        try:
            data, media_type = await read_image(call, call.arguments["path"])
            facts["description"] = await ask_about_image(call.ctx.models, data, media_type, None)
        except ToolError as exc:
            facts["description_unavailable"] = exc.message
    return facts


def _path_only(what: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"path": {**_PATH, "description": what}},
        "required": ["path"],
        "additionalProperties": False,
    }


_TRANSCRIBE_DESCRIPTION = (
    "Transcribe the English speech in an audio or video file of your workspace to text (pocketsphinx, offline; "
    "ffmpeg decodes any common format). Returns text and the seconds of audio heard."
)

TOOLS = (
    Builtin(
        name="rune@text-to-speech",
        description=("Speak a text with espeak-ng into a WAV file in your workspace. Returns its path, bytes, sha256 and "
                     "duration. voice is an espeak-ng voice (default en; e.g. en-us, en+f3, de); speed in words per minute."),
        parameters={
            "type": "object",
            "properties": {
                "text": {"type": "string", "minLength": 1, "description": "what to say"},
                "path": {**_PATH, "description": "where to write the WAV in your workspace (default: speech-<random>.wav)"},
                "voice": {"type": "string", "pattern": "^[A-Za-z0-9_+-]{1,40}$", "description": "an espeak-ng voice name"},
                "speed": {"type": "integer", "minimum": 80, "maximum": 450, "description": "words per minute (default 175)"},
            },
            "required": ["text"],
            "additionalProperties": False,
        },
        run=_speak,
        timeout_ms=_timeout_ms,
        needs=lambda config: media_problem(config, ("espeak",)),
        runs_process=True,
    ),
    Builtin(
        name="rune@speech-to-text",
        description=_TRANSCRIBE_DESCRIPTION,
        parameters=_path_only("the audio file in your workspace (relative path)"),
        run=_transcribe,
        timeout_ms=_timeout_ms,
        needs=lambda config: media_problem(config, ("ffmpeg",), transcribes=True),
        runs_process=True,
    ),
    Builtin(
        name="rune@media-transcribe",
        description=_TRANSCRIBE_DESCRIPTION,
        parameters=_path_only("the audio or video file in your workspace (relative path)"),
        run=_transcribe,
        timeout_ms=_timeout_ms,
        needs=lambda config: media_problem(config, ("ffmpeg",), transcribes=True),
        runs_process=True,
    ),
    Builtin(
        name="rune@media-describe",
        description=("Describe an audio, video or image file of your workspace from what ffprobe reads in it: container "
                     "format, duration, bit rate, and each stream's codec, size, frame rate, sample rate and channels; "
                     "for a PNG, JPEG, GIF or WebP image also what your model sees in it."),
        parameters=_path_only("the media file in your workspace (relative path)"),
        run=_describe,
        timeout_ms=_timeout_ms,
        needs=lambda config: media_problem(config, ("ffprobe",)),
        runs_process=True,
    ),
)
