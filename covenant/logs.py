"""The daemon's log: one structured line per event, logfmt or JSON.

Every ``extra={...}`` key of a log call becomes a field, so
``log.info("agent stderr", extra={"agent": a, "intent": i, "line": text})``
renders as ``ts=… level=info logger=covenant.runtime msg="agent stderr" agent=a
intent=i line="…"``. Under systemd (``JOURNAL_STREAM`` names our output
stream) each line starts with a ``<N>`` syslog priority so journald files it
at the right level. Settings come from CLI > env > covenant.toml > default.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Literal, TypeVar

from covenant.clock import iso_ms
from covenant.config import LogConfig
from covenant.errors import ConfigError
from covenant.log_extras import is_extra
from covenant.terminal import json_escaped

__all__ = [
    "LogSettings",
    "LEVELS",
    "FORMATS",
    "resolve_log_settings",
    "parse_target",
    "setup_logging",
    "record_fields",
    "iso_timestamp",
    "format_logfmt",
    "format_json",
    "StructuredFormatter",
    "syslog_priority",
    "journal_stream_matches",
]

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
FORMATS = ("logfmt", "json")
_DEFAULTS = LogConfig()

_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")
_VALUE_NEEDS_QUOTES = re.compile(r'[\s"=\\]')
_HANDLER_MARK = "_covenant_log_handler"


@dataclass(frozen=True)
class LogSettings:
    """Resolved log settings: ``target`` is ``stderr``, ``stdout`` or ``file:/abs/path``."""

    level: str = _DEFAULTS.level
    format: Literal["logfmt", "json"] = _DEFAULTS.format
    target: str = _DEFAULTS.target


def _check_level(value: str, source: str) -> str:
    level = value.strip().lower()
    if level == "warn":
        level = "warning"
    if level not in LEVELS:
        raise ConfigError(
            f"{source}: log level {value!r} is not one of {', '.join(LEVELS)}",
            field="log.level",
        )
    return level


def _check_format(value: str, source: str) -> Literal["logfmt", "json"]:
    fmt = value.strip().lower()
    if fmt == "logfmt":
        return "logfmt"
    if fmt == "json":
        return "json"
    raise ConfigError(f"{source}: log format {value!r} is not one of logfmt, json", field="log.format")


def parse_target(value: str, source: str = "log target") -> str:
    """Normalise a target: ``stderr``, ``stdout`` or ``file:PATH`` (made absolute)."""
    target = value.strip()
    if target in ("stderr", "stdout"):
        return target
    if target.startswith("file:"):
        path = target[len("file:"):]
        if not path:
            raise ConfigError(f"{source}: `file:` needs a path, e.g. file:/var/log/covenant.log", field="log.target")
        return "file:" + os.path.abspath(os.path.expanduser(path))
    raise ConfigError(
        f"{source}: log target {value!r} is not stderr, stdout or file:PATH",
        field="log.target",
    )


_Setting = TypeVar("_Setting", bound=str)


def _first_set(
    key: str,
    cli_value: str | None,
    cli_flag: str,
    env: Mapping[str, str],
    config_value: str,
    check: Callable[[str, str], _Setting],
) -> _Setting:
    """``cli_value``, else env ``COVENANT_LOG_<KEY>``, else covenant.toml's; ``check`` names the source."""
    env_name = f"COVENANT_LOG_{key.upper()}"
    if cli_value:
        return check(cli_value, cli_flag)
    if env.get(env_name):
        return check(env[env_name], f"env {env_name}")
    return check(config_value, f"covenant.toml [log] {key}")


def resolve_log_settings(
    cli_level: str | None,
    cli_target: str | None,
    env: Mapping[str, str],
    config: LogConfig,
) -> LogSettings:
    """Pick each setting from the first source that sets it: CLI, env, covenant.toml, default.

    Env: ``COVENANT_LOG_LEVEL``, ``COVENANT_LOG_TARGET``, ``COVENANT_LOG_FORMAT``
    (empty counts as unset). The format has no CLI flag. Bad values raise a
    ConfigError that names where the value came from.
    """
    level = _first_set("level", cli_level, "--log-level", env, config.level, _check_level)
    target = _first_set("target", cli_target, "--log-target", env, config.target, parse_target)
    fmt = _first_set("format", None, "", env, config.format, _check_format)
    return LogSettings(level=level, format=fmt, target=target)


def iso_timestamp(created: float) -> str:
    """UTC with milliseconds, e.g. ``2026-05-02T10:15:03.412Z`` (the ``ts`` field)."""
    return iso_ms(int(created * 1000))


def _plain(value: Any) -> Any:
    """A JSON-safe version of an extra value (str() for anything exotic)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields of one event, in order: ts, level, logger, msg, then every extra.

    Values are JSON-safe. An extra that collides with a base field is kept
    under its name plus ``_``. Tracebacks become ``exc`` (and ``stack``).
    Computed once per record (each handler gets its own copy): the daemon has two handlers.
    """
    cached = record.__dict__.get("_covenant_fields")
    if cached is not None:
        return dict(cached)
    fields: dict[str, Any] = {
        "ts": iso_timestamp(record.created),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in record.__dict__.items():
        if not is_extra(key):
            continue
        name = key if key not in fields else key + "_"
        fields[name] = _plain(value)
    if record.exc_info and record.exc_info[0] is not None:
        fields["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
    elif record.exc_text:
        fields["exc"] = record.exc_text
    if record.stack_info:
        fields["stack"] = record.stack_info.rstrip()
    record.__dict__["_covenant_fields"] = fields  # underscored: never read back as an extra
    return dict(fields)


def _logfmt_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if text and text.isprintable() and not _VALUE_NEEDS_QUOTES.search(text):
        return text
    return _quote(text)


def _quote(text: str) -> str:
    """Double-quoted with JSON escapes, so logfmt and JSON parsers both read it back.

    Readable UTF-8 stays as is; anything non-printable (control characters,
    U+2028 and friends) is escaped, so one event is always one line.
    """
    out = ['"']
    for ch in text:
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(json.dumps(ch)[1:-1])
    out.append('"')
    return "".join(out)


def format_logfmt(fields: Mapping[str, Any]) -> str:
    """``key=value`` pairs separated by spaces; values quoted when they need it."""
    parts = []
    for key, value in fields.items():
        safe_key = _KEY_UNSAFE.sub("_", key) or "_"
        parts.append(f"{safe_key}={_logfmt_value(value)}")
    return " ".join(parts)


def format_json(fields: Mapping[str, Any]) -> str:
    """One JSON object on one line (UTF-8 kept readable unless it holds lone surrogates); agents' text in
    it acts on no terminal and stays on its line (:func:`covenant.terminal.json_escaped`)."""
    line = json.dumps(fields, ensure_ascii=False, separators=(",", ":"), default=str)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        # Undecodable agent output (surrogateescape) cannot be written as UTF-8.
        return json.dumps(fields, ensure_ascii=True, separators=(",", ":"), default=str)
    return json_escaped(line)


def syslog_priority(levelno: int) -> int:
    """journald/syslog priority for a Python level: debug 7, info 6, warning 4, error 3, critical 2."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


class StructuredFormatter(logging.Formatter):
    """Formats a record as one logfmt or JSON line, optionally with a ``<N>`` priority prefix."""

    def __init__(self, fmt: Literal["logfmt", "json"] = "logfmt", journal_prefix: bool = False) -> None:
        super().__init__()
        self.kind = fmt
        self.journal_prefix = journal_prefix

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        line = format_json(fields) if self.kind == "json" else format_logfmt(fields)
        if self.journal_prefix:
            return f"<{syslog_priority(record.levelno)}>{line}"
        return line


def journal_stream_matches(stream: IO[str], env: Mapping[str, str] | None = None) -> bool:
    """True when ``$JOURNAL_STREAM`` (``dev:inode``) is the file behind ``stream``.

    systemd sets JOURNAL_STREAM when stdout/stderr go to journald; comparing
    device and inode (as systemd.exec(5) advises) avoids prefixing lines that
    were redirected elsewhere, e.g. by a wrapper script.
    """
    env = os.environ if env is None else env
    raw = env.get("JOURNAL_STREAM", "")
    dev_s, sep, ino_s = raw.partition(":")
    if not sep:
        return False
    try:
        st = os.fstat(stream.fileno())
        return st.st_dev == int(dev_s) and st.st_ino == int(ino_s)
    except (OSError, ValueError, AttributeError):
        return False


def _open_handler(target: str) -> tuple[logging.Handler, IO[str] | None]:
    if target == "stderr":
        return logging.StreamHandler(sys.stderr), sys.stderr
    if target == "stdout":
        return logging.StreamHandler(sys.stdout), sys.stdout
    path = target[len("file:"):]
    try:
        # Here: logging.handlers (with pickle, queue and socketserver's kin) only for a file target (issue 38).
        from covenant.log_file import PrivateLogFile

        # WatchedFileHandler reopens the file when logrotate moves it away.
        return PrivateLogFile(path, encoding="utf-8"), None
    except OSError as exc:
        raise ConfigError(
            f"log target file:{path} cannot be opened for appending ({exc.strerror}); "
            "choose a writable path with --log-target, COVENANT_LOG_TARGET or [log] target",
            field="log.target",
            path=path,
        ) from None


def setup_logging(settings: LogSettings) -> None:
    """Configure the ``covenant`` logger: level, one handler, the chosen line format.

    Safe to call again (on reload): the handler installed by a previous call is
    replaced and closed, handlers added by others (e.g. the log broadcaster)
    stay. Records do not propagate to the root logger, so nothing is printed twice.
    """
    level = LEVELS[_check_level(settings.level, "log settings")]
    fmt = _check_format(settings.format, "log settings")
    handler, stream = _open_handler(parse_target(settings.target))
    journal = stream is not None and journal_stream_matches(stream)
    handler.setFormatter(StructuredFormatter(fmt, journal_prefix=journal))
    setattr(handler, _HANDLER_MARK, True)

    logger = logging.getLogger("covenant")
    for old in [h for h in logger.handlers if getattr(h, _HANDLER_MARK, False)]:
        logger.removeHandler(old)
        old.close()
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
