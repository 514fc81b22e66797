"""Where the media tools run: covenant's media runner under the replicas' interpreter, in the agent's sandbox.

The runner script (:mod:`covenant.tools.media_runner`) runs under ``[rune] python`` (default: the
daemon's own interpreter), which agent uids must be able to run, as the agent's uid through the tool
runner. It starts the distribution's ``espeak-ng``, ``ffmpeg`` and ``ffprobe`` (looked up on
``[runtime] path`` unless ``[tools.media]`` names them absolutely) and, to transcribe, imports
``pocketsphinx`` (its bundled English model) in that interpreter. Each tool needs only its own
programs: :func:`media_problem` says why one is unavailable here, in words an operator can act on.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from covenant.config import Config
from covenant.runtime.launch_plans import resolve_program
from covenant.runtime.tool_files import interpreter_roots
from covenant.tools.wasm_backend import closed_to_others

__all__ = ["RUNNER", "MediaBackend", "media_backend", "media_problem", "program"]

RUNNER = str(Path(__file__).with_name("media_runner.py"))
_PROBE = "import os, pocketsphinx; print(os.path.dirname(pocketsphinx.__file__))"
_INSTALL = {"espeak": "espeak-ng", "ffmpeg": "ffmpeg", "ffprobe": "ffmpeg"}
"""The Debian/Ubuntu package that brings each program."""


@dataclass(frozen=True)
class MediaBackend:
    prefix: tuple[str, ...]
    """``python -I media_runner.py``: the request follows on stdin."""
    read_only: tuple[str, ...]
    """Beyond the system's files: the interpreter's prefix (a venv) and the runner script, for the run's Landlock rules."""


@functools.lru_cache(maxsize=8)
def _interpreter(python: str) -> MediaBackend | str:
    closed = closed_to_others(RUNNER)
    if closed is not None:
        return f"covenant's media runner is not readable by agent uids: {closed} is closed to them"
    return MediaBackend((python, "-I", RUNNER), (*interpreter_roots(python), RUNNER))


@functools.lru_cache(maxsize=8)
def _pocketsphinx(python: str) -> str | None:
    """Why ``python`` cannot transcribe (pocketsphinx missing or closed to agent uids), or None."""
    try:
        probe = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"speech is transcribed under [rune] python ({python}), which cannot be started: {exc}"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return (f"speech is transcribed by pocketsphinx under [rune] python ({python}), which cannot import it ({last}); "
                f"install it there: {python} -m pip install pocketsphinx")
    folder = probe.stdout.strip()
    closed = closed_to_others(folder)
    if closed is not None:
        return f"pocketsphinx ({folder}) is not readable by agent uids: {closed} is closed to them"
    return None


def media_backend(config: Config) -> MediaBackend | str:
    """This config's runner command, or why media tools cannot run here."""
    return _interpreter(config.rune.python or sys.executable)


def program(config: Config, which: str) -> str | None:
    """The absolute path of ``espeak``, ``ffmpeg`` or ``ffprobe`` as ``[tools.media]`` names it, or None."""
    return resolve_program(getattr(config.tools.media, which), config.runtime.path)


def media_problem(config: Config, programs: tuple[str, ...], *, transcribes: bool = False) -> str | None:
    """Why a media tool that runs ``programs`` (and pocketsphinx when it ``transcribes``) is unavailable, or None.

    Blocking the first time an interpreter is judged for pocketsphinx (it starts that interpreter once).
    """
    backend = media_backend(config)
    if isinstance(backend, str):
        return backend
    for which in programs:
        if program(config, which) is None:
            name = getattr(config.tools.media, which)
            return (f"needs {name} ([tools.media] {which}), not found on [runtime] path ({config.runtime.path}); "
                    f"install it: apt-get install {_INSTALL[which]}")
    if transcribes:
        return _pocketsphinx(config.rune.python or sys.executable)
    return None
