"""Where the media tools run: covenant's media runner under the replicas' interpreter, in the agent's sandbox.

The runner script (:mod:`covenant.tools.media_runner`) runs under ``[rune] python`` (default: the
daemon's own interpreter), which agent uids must be able to run, as the agent's uid through the tool
runner. It starts the distribution's ``espeak-ng``, ``ffmpeg`` and ``ffprobe`` (looked up on
``[runtime] path`` unless ``[tools.media]`` names them absolutely) and, to transcribe, imports
``pocketsphinx`` (its bundled English model) in that interpreter. Each tool needs only its own
programs: :func:`media_problem` says why one is unavailable here, in words an operator can act on.
"""

from __future__ import annotations

import sys
from pathlib import Path

from covenant.config import Config
from covenant.runtime.launch_plans import resolve_program
from covenant.tools.runner_python import RunnerCommand, import_problem, runner_command

__all__ = ["RUNNER", "media_backend", "media_problem", "program"]

RUNNER = str(Path(__file__).with_name("media_runner.py"))
_INSTALL = {"espeak": "espeak-ng", "ffmpeg": "ffmpeg", "ffprobe": "ffmpeg"}
"""The Debian/Ubuntu package that brings each program."""


def media_backend(config: Config) -> RunnerCommand | str:
    """This config's runner command, or why media tools cannot run here."""
    return runner_command(config.rune.python or sys.executable, RUNNER, "media runner")


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
        return import_problem(config.rune.python or sys.executable, "pocketsphinx", "speech is transcribed", "by")
    return None
