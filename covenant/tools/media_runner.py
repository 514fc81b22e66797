"""Runs one media tool call: espeak-ng, ffmpeg/ffprobe and pocketsphinx as the agent, in its workspace.

Started by the tool runner (the agent's uid, its limits, its Landlock rules: the system's files and the
interpreter read-only, the workspace read-write, its scratch dir as ``TMPDIR``) as
``python -I media_runner.py``, never inside the daemon. It imports only the standard library and, to
transcribe, ``pocketsphinx``: covenant's package is not on its path.

Stdin is one JSON document ``{"op": "speak" | "transcribe" | "describe", ...}`` made by the daemon
(:mod:`covenant.tools.builtins.media`); stdout is one JSON document, ``{"ok": {...}}`` or
``{"error": {"code", "message"}}``. The working directory is the workspace, and every path is opened
beneath it one component at a time, never through a symlink (``O_NOFOLLOW``): a path that would leave
it fails in the open, whatever Landlock would also refuse. A file is handed to ffmpeg or ffprobe as
``/proc/self/fd/N`` of the descriptor checked here, so what they read is what was checked.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import wave
from typing import Any, NoReturn

_SAMPLE_RATE = 16000
"""pocketsphinx's bundled English model listens at 16 kHz, mono, 16-bit."""
_TOOL_STDERR_CHARS = 300


class Refusal(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _answer(document: dict[str, Any]) -> NoReturn:
    sys.stdout.write(json.dumps(document, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    sys.exit(0)


def _parts(path: str) -> list[str]:
    if not isinstance(path, str) or not path or "\0" in path:
        raise Refusal("path_refused", "the path must be a non-empty string without NUL bytes")
    if path.startswith("/"):
        raise Refusal("path_refused", f"{path!r} is absolute; paths are relative to the workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refusal("path_refused", f"{path!r} has a '..' component; paths may not climb out of the workspace")
    if not parts:
        raise Refusal("wrong_file_type", f"{path!r} is the workspace itself, not a file")
    return parts


def _os_refusal(path: str, exc: OSError) -> Refusal:
    if exc.errno == errno.ENOENT:
        return Refusal("file_not_found", f"{path!r}: no such file in the workspace")
    if exc.errno in (errno.ELOOP, errno.EXDEV):
        return Refusal("path_refused", f"{path!r} goes through a symlink; media tools never follow one")
    if exc.errno in (errno.EISDIR, errno.ENOTDIR, errno.ENXIO):
        return Refusal("wrong_file_type", f"{path!r}: {exc.strerror}")
    return Refusal("tool_failed", f"{path!r}: {exc.strerror}")


def _parent_fd(path: str, *, create: bool) -> tuple[int, str]:
    """An fd of the folder holding ``path`` (walked from the workspace without following a symlink) and its name."""
    parts = _parts(path)
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except NotADirectoryError:  # O_DIRECTORY meets a symlink before O_NOFOLLOW does
                if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                    raise OSError(errno.ELOOP, "a symlink") from None
                raise
            os.close(fd)
            fd = next_fd
    except OSError as exc:
        os.close(fd)
        raise _os_refusal(path, exc) from None
    return fd, parts[-1]


def _open_input(path: str, max_bytes: int) -> tuple[int, int]:
    """(fd, size) of a regular file in the workspace no larger than ``max_bytes``."""
    parent, name = _parent_fd(path, create=False)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=parent)
    except OSError as exc:
        raise _os_refusal(path, exc) from None
    finally:
        os.close(parent)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Refusal("wrong_file_type", f"{path!r} is not a regular file")
    if info.st_size > max_bytes:
        os.close(fd)
        raise Refusal("file_too_large", f"{path!r} is {info.st_size} bytes, more than [tools.media] input_max_bytes "
                                        f"({max_bytes})")
    return fd, info.st_size


def _write_output(path: str, data: bytes) -> None:
    parent, name = _parent_fd(path, create=True)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=parent)
    except OSError as exc:
        raise _os_refusal(path, exc) from None
    finally:
        os.close(parent)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refusal("wrong_file_type", f"{path!r} exists and is not a regular file")
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _last_line(stderr: bytes) -> str:
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1][-_TOOL_STDERR_CHARS:] if lines else "no message"


def _proc_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def speak(request: dict[str, Any]) -> dict[str, Any]:
    """espeak-ng reads the text on stdin (never as an argument: text starting with '-' stays text) and writes a WAV."""
    path, text = request["path"], request["text"]
    _parts(path)
    command = [request["espeak"], "--stdin", "-v", request.get("voice") or "en", "-w", ""]
    if request.get("speed") is not None:
        command[1:1] = ["-s", str(int(request["speed"]))]
    with tempfile.TemporaryDirectory(prefix="tts-") as scratch:
        wav = os.path.join(scratch, "speech.wav")
        command[-1] = wav
        done = subprocess.run(command, input=text.encode("utf-8"), capture_output=True, timeout=request["timeout_s"], check=False)
        if done.returncode != 0 or not os.path.isfile(wav):
            raise Refusal("tool_failed", f"espeak-ng failed (exit {done.returncode}): {_last_line(done.stderr)}")
        size = os.path.getsize(wav)
        if size > request["max_bytes"]:
            raise Refusal("file_too_large", f"the speech is {size} bytes of WAV, more than [tools.media] output_max_bytes "
                                            f"({request['max_bytes']}); say less at a time")
        with open(wav, "rb") as f:
            data = f.read()
        with wave.open(wav, "rb") as w:
            rate, frames, channels = w.getframerate(), w.getnframes(), w.getnchannels()
    _write_output(path, data)
    return {
        "path": "/".join(_parts(path)), "media_type": "audio/wav", "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(), "sample_rate": rate, "channels": channels,
        "duration_s": round(frames / rate, 3) if rate else 0.0,
    }


def _decode_pcm(request: dict[str, Any], fd: int, path: str) -> bytes:
    """The file's first ``max_audio_s`` seconds as 16 kHz mono 16-bit PCM, decoded by ffmpeg."""
    command = [
        request["ffmpeg"], "-nostdin", "-hide_banner", "-v", "error", "-i", _proc_path(fd), "-vn",
        "-t", str(request["max_audio_s"]), "-f", "s16le", "-ac", "1", "-ar", str(_SAMPLE_RATE), "pipe:1",
    ]
    done = subprocess.run(command, capture_output=True, timeout=request["timeout_s"], pass_fds=(fd,), check=False)
    if done.returncode != 0:
        raise Refusal("media_unreadable", f"{path!r} is not audio ffmpeg can decode: {_last_line(done.stderr)}")
    if not done.stdout:
        raise Refusal("media_unreadable", f"{path!r} holds no audio stream")
    return done.stdout


def transcribe(request: dict[str, Any]) -> dict[str, Any]:
    path = request["path"]
    fd, size = _open_input(path, request["max_bytes"])
    try:
        pcm = _decode_pcm(request, fd, path)
    finally:
        os.close(fd)
    try:
        from pocketsphinx import Decoder
    except ImportError as exc:
        raise Refusal("tool_unavailable", f"this interpreter cannot import pocketsphinx ({exc})") from None
    decoder = Decoder(samprate=_SAMPLE_RATE, logfn=os.devnull)
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    seconds = len(pcm) / (2 * _SAMPLE_RATE)
    return {
        "text": hypothesis.hypstr if hypothesis is not None else "",
        "path": "/".join(_parts(path)), "bytes": size, "audio_s": round(seconds, 3),
        "cut_at_s": request["max_audio_s"] if seconds >= request["max_audio_s"] else None,
        "engine": "pocketsphinx (en-us)",
    }


_FORMAT_FACTS = ("format_name", "format_long_name", "duration", "bit_rate", "nb_streams")
_STREAM_FACTS = (
    "index", "codec_type", "codec_name", "codec_long_name", "duration", "bit_rate", "width", "height",
    "pix_fmt", "r_frame_rate", "sample_rate", "channels", "channel_layout", "nb_frames",
)
_NUMBERS = ("duration", "bit_rate", "sample_rate", "nb_frames", "nb_streams")


def _facts(source: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys:
        value = source.get(key)
        if value is None or value == "N/A":
            continue
        if key in _NUMBERS and isinstance(value, str):
            try:
                value = float(value) if "." in value else int(value)
            except ValueError:
                continue
        out[key] = value
    return out


def describe(request: dict[str, Any]) -> dict[str, Any]:
    path = request["path"]
    fd, size = _open_input(path, request["max_bytes"])
    try:
        command = [request["ffprobe"], "-hide_banner", "-v", "error", "-print_format", "json", "-show_format",
                   "-show_streams", _proc_path(fd)]
        done = subprocess.run(command, capture_output=True, timeout=request["timeout_s"], pass_fds=(fd,), check=False)
    finally:
        os.close(fd)
    if done.returncode != 0:
        raise Refusal("media_unreadable", f"{path!r} is not media ffprobe can read: {_last_line(done.stderr)}")
    try:
        probe = json.loads(done.stdout)
    except ValueError:
        raise Refusal("tool_failed", "ffprobe answered something that is not JSON") from None
    streams = [_facts(s, _STREAM_FACTS) for s in probe.get("streams", []) if isinstance(s, dict)]
    if not streams:
        raise Refusal("media_unreadable", f"{path!r} holds no audio, video or image stream")
    return {"path": "/".join(_parts(path)), "bytes": size, "format": _facts(probe.get("format", {}), _FORMAT_FACTS),
            "streams": streams}


_OPS = {"speak": speak, "transcribe": transcribe, "describe": describe}


def main() -> None:
    try:
        request = json.loads(sys.stdin.buffer.read())
        operation = _OPS[request["op"]]
    except (ValueError, KeyError, TypeError) as exc:
        _answer({"error": {"code": "tool_failed", "message": f"the media runner got a bad request: {exc!r}"}})
    try:
        _answer({"ok": operation(request)})
    except Refusal as refusal:
        _answer({"error": {"code": refusal.code, "message": refusal.message}})
    except subprocess.TimeoutExpired as exc:
        _answer({"error": {"code": "tool_timeout", "message": f"{os.path.basename(str(exc.cmd[0]))} took longer than "
                                                               f"{exc.timeout:g} s and was stopped"}})
    except OSError as exc:
        _answer({"error": {"code": "tool_failed", "message": f"{exc.strerror or exc}"}})


if __name__ == "__main__":
    main()
