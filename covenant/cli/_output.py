"""Click-free output for the CLI: the one renderer both the click commands and
the fast ``covenant dispatch`` path use, so their text and exit codes match.

``echo`` writes text with a trailing newline, UTF-8 (with ``replace``) when
the stream's encoding is ASCII, and a flush after each write. What it writes
is :func:`neutralize`-d first, on a terminal and in a pipe alike: the CLI
prints agents' answers, their stderr, models' text and log lines, and none of
it may act on the operator's terminal. Every command writes through it.
``run_standalone`` mirrors what click's standalone mode does with Ctrl-C and a
closed pipe. Importing click costs ~30 ms, which the dispatch path cannot pay.
"""

from __future__ import annotations

import codecs
import sys

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    from typing import Any, Callable, NoReturn, TextIO

from covenant.terminal import json_escaped, neutralize

__all__ = ["echo", "echo_json", "fail", "neutralize", "print_json", "table_lines", "run_standalone"]


def _is_ascii(encoding: str | None) -> bool:
    try:
        return codecs.lookup(encoding or "ascii").name == "ascii"
    except LookupError:
        return False


def echo(message: str = "", *, err: bool = False) -> None:
    """Write ``message``, :func:`neutralize`-d, and a newline to stdout (stderr with ``err``), then flush."""
    _write(neutralize(message) + "\n", err)


def _write(text: str, err: bool) -> None:
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    buffer = getattr(stream, "buffer", None)
    if buffer is not None and _is_ascii(getattr(stream, "encoding", None)):
        stream.flush()
        buffer.write(text.encode("utf-8", "replace"))
        buffer.flush()
        return
    stream.write(text)
    stream.flush()


def fail(message: str, exit_code: int) -> NoReturn:
    """Print ``covenant: error: message`` to stderr and exit."""
    echo(f"covenant: error: {message}", err=True)
    sys.exit(exit_code)


def print_json(obj: Any) -> None:
    """Stable JSON for --json output: sorted keys, one document, trailing newline."""
    import json  # here: indented JSON needs the json package, which plain `covenant dispatch` never imports

    echo_json(json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, default=str))


def echo_json(document: str) -> None:
    """Write the JSON ``document`` (text) and a newline to stdout, exact and valid: what :data:`covenant.terminal.ACTIVE`
    names is written as a JSON escape (:func:`covenant.terminal.json_escaped`)."""
    _write(json_escaped(document) + "\n", False)


def table_lines(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Plain aligned columns (two spaces apart, no trailing blanks): greppable and pasteable."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in (headers, *rows)]


class _QuietFlush:
    """Wraps a standard stream so the interpreter's final flush ignores a closed pipe."""

    def __init__(self, wrapped: TextIO) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        try:
            self.wrapped.flush()
        except BrokenPipeError:
            pass

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.wrapped, attr)


def run_standalone(command: Callable[[], None]) -> NoReturn:
    """Run ``command`` and exit as a click command in standalone mode would.

    Ctrl-C (or EOF on stdin) prints a blank line and ``Aborted!`` and exits 1;
    a closed stdout or stderr pipe exits 1 quietly; a normal return exits 0;
    ``sys.exit`` inside ``command`` passes through.
    """
    try:
        try:
            command()
        except (EOFError, KeyboardInterrupt):
            echo(err=True)
            echo("Aborted!", err=True)
        except BrokenPipeError:
            sys.stdout = _QuietFlush(sys.stdout)  # type: ignore[assignment]
            sys.stderr = _QuietFlush(sys.stderr)  # type: ignore[assignment]
        else:
            sys.exit(0)
        sys.exit(1)
    except (EOFError, KeyboardInterrupt):
        sys.exit(1)
