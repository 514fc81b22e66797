"""Structured log lines, journald priorities, and where the settings come from."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from covenant.config import LogConfig
from covenant.errors import ConfigError
from covenant.logs import (
    LogSettings,
    StructuredFormatter,
    format_logfmt,
    resolve_log_settings,
    setup_logging,
    syslog_priority,
)
from tests.conftest import REPO_ROOT

LOGFMT_PAIR = re.compile(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|[^\s"]*)')


def parse_logfmt(line: str) -> dict[str, str]:
    """An independent logfmt reader: bare values as text, quoted values JSON-unescaped."""
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(line):
        match = LOGFMT_PAIR.match(line, pos)
        assert match, f"not logfmt at column {pos}: {line!r}"
        key, raw = match.groups()
        fields[key] = json.loads(raw) if raw.startswith('"') else raw
        pos = match.end()
        if pos < len(line):
            assert line[pos] == " ", line
            pos += 1
    return fields


def make_record(msg: str, level: int = logging.INFO, **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("covenant.test")
    return logger.makeRecord(logger.name, level, __file__, 1, msg, (), None, extra=extra)


def test_logfmt_line_has_base_fields_and_every_extra() -> None:
    record = make_record(
        'agent said "hi"\nand left',
        agent="summarize",
        intent="01HZX",
        line="C:\\temp = full",
        exit_code=0,
        ok=True,
        peak=None,
        ratio=0.5,
        text="café",
    )
    line = StructuredFormatter("logfmt").format(record)
    assert "\n" not in line
    fields = parse_logfmt(line)
    assert list(fields)[:4] == ["ts", "level", "logger", "msg"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields["ts"])
    assert fields["level"] == "info"
    assert fields["logger"] == "covenant.test"
    assert fields["msg"] == 'agent said "hi"\nand left'
    assert fields["agent"] == "summarize"
    assert fields["intent"] == "01HZX"
    assert fields["line"] == "C:\\temp = full"
    assert fields["exit_code"] == "0"
    assert fields["ok"] == "true"
    assert fields["peak"] == "null"
    assert fields["ratio"] == "0.5"
    assert fields["text"] == "café"


def test_logfmt_escapes_control_characters_and_keeps_one_line() -> None:
    hostile = "a\rb\x00c\x1b[31md\u2028e\tf"
    line = format_logfmt({"line": hostile, "empty": "", "bad key!": "v"})
    assert "\r" not in line and "\x00" not in line and "\u2028" not in line and "\x1b" not in line
    fields = parse_logfmt(line)
    assert fields == {"line": hostile, "empty": "", "bad_key_": "v"}


def test_json_line_round_trips_with_extras_and_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = make_record("spawn failed", logging.ERROR, agent="a1", intent="i1", pid=42)
        record.exc_info = sys.exc_info()
    line = StructuredFormatter("json").format(record)
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["level"] == "error"
    assert fields["msg"] == "spawn failed"
    assert (fields["agent"], fields["intent"], fields["pid"]) == ("a1", "i1", 42)
    assert "ValueError: boom" in fields["exc"]


def test_json_line_escapes_what_a_terminal_would_act_on() -> None:
    """JSON escapes C0 controls only; C1 codes, DEL, bidi overrides and line separators are escaped too,
    so `cat` of the log shows them and one event stays one line for every reader."""
    hostile = "a\x9b31mb\x7fc\u202ed\u2028e\x1b"
    line = StructuredFormatter("json").format(make_record("agent stderr", line=hostile))
    assert not [c for c in ("\x9b", "\x7f", "\u202e", "\u2028", "\x1b") if c in line], repr(line)
    assert json.loads(line)["line"] == hostile


def test_extras_colliding_with_base_fields_are_kept() -> None:
    fields = json.loads(StructuredFormatter("json").format(make_record("m", level_="x", ts="mine")))
    assert fields["ts"] != "mine" and fields["ts_"] == "mine"


def test_json_survives_undecodable_agent_output() -> None:
    raw = b"bad \xff byte".decode("utf-8", "surrogateescape")
    line = StructuredFormatter("json").format(make_record("agent stderr", line=raw))
    line.encode("utf-8")
    assert json.loads(line)["line"] == raw


def test_priorities_match_syslog() -> None:
    got = {name: syslog_priority(getattr(logging, name.upper())) for name in ("debug", "info", "warning", "error", "critical")}
    assert got == {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


# --- precedence: CLI > env > covenant.toml > default ------------------------------------


def test_defaults() -> None:
    assert resolve_log_settings(None, None, {}, LogConfig()) == LogSettings("info", "logfmt", "stderr")


def test_config_beats_default() -> None:
    cfg = LogConfig(level="debug", format="json", target="stdout")
    assert resolve_log_settings(None, None, {}, cfg) == LogSettings("debug", "json", "stdout")


def test_env_beats_config(tmp_path: Path) -> None:
    cfg = LogConfig(level="debug", format="json", target="stdout")
    env = {
        "COVENANT_LOG_LEVEL": "ERROR",
        "COVENANT_LOG_FORMAT": "logfmt",
        "COVENANT_LOG_TARGET": f"file:{tmp_path}/d.log",
    }
    assert resolve_log_settings(None, None, env, cfg) == LogSettings("error", "logfmt", f"file:{tmp_path}/d.log")


def test_cli_beats_env_and_config() -> None:
    cfg = LogConfig(level="debug", target="stdout")
    env = {"COVENANT_LOG_LEVEL": "error", "COVENANT_LOG_TARGET": "stdout"}
    got = resolve_log_settings("warning", "stderr", env, cfg)
    assert (got.level, got.target) == ("warning", "stderr")


def test_empty_env_counts_as_unset() -> None:
    got = resolve_log_settings(None, None, {"COVENANT_LOG_LEVEL": "", "COVENANT_LOG_TARGET": ""}, LogConfig(level="error"))
    assert (got.level, got.target) == ("error", "stderr")


def test_relative_file_target_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    got = resolve_log_settings(None, "file:logs/d.log", {}, LogConfig())
    assert got.target == f"file:{tmp_path}/logs/d.log"


@pytest.mark.parametrize(
    ("cli_level", "cli_target", "env", "needle"),
    [
        ("loud", None, {}, "--log-level"),
        (None, "syslog", {}, "--log-target"),
        (None, None, {"COVENANT_LOG_LEVEL": "trace"}, "env COVENANT_LOG_LEVEL"),
        (None, None, {"COVENANT_LOG_TARGET": "file:"}, "env COVENANT_LOG_TARGET"),
        (None, None, {"COVENANT_LOG_FORMAT": "xml"}, "env COVENANT_LOG_FORMAT"),
    ],
)
def test_bad_values_name_their_source(cli_level: str | None, cli_target: str | None, env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_log_settings(cli_level, cli_target, env, LogConfig())
    assert needle in info.value.message


def test_bad_config_target_names_covenant_toml() -> None:
    with pytest.raises(ConfigError, match=r"covenant.toml \[log\] target"):
        resolve_log_settings(None, None, {}, LogConfig(target="journald"))


# --- setup_logging: real streams and files ----------------------------------------------


@pytest.fixture
def restore_covenant_logger():
    logger = logging.getLogger("covenant")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    for handler in list(logger.handlers):
        if handler not in saved[0]:
            logger.removeHandler(handler)
            handler.close()
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def test_file_target_writes_lines_and_reconfigures(tmp_path: Path, restore_covenant_logger: logging.Logger) -> None:
    first = tmp_path / "first.log"
    second = tmp_path / "second.log"
    setup_logging(LogSettings("info", "json", f"file:{first}"))
    log = logging.getLogger("covenant.runtime")
    log.debug("hidden")
    log.info("agent stderr", extra={"agent": "a1", "intent": "i1", "line": "warming up"})
    # A reload reconfigures: the old handler goes, the level and format change.
    setup_logging(LogSettings("debug", "logfmt", f"file:{second}"))
    log.debug("now visible", extra={"agent": "a1"})
    handlers = [h for h in restore_covenant_logger.handlers if getattr(h, "_covenant_log_handler", False)]
    assert len(handlers) == 1
    lines = first.read_text().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert (event["agent"], event["intent"], event["line"]) == ("a1", "i1", "warming up")
    second_fields = parse_logfmt(second.read_text().splitlines()[0])
    assert second_fields["level"] == "debug" and second_fields["msg"] == "now visible"


def test_unwritable_file_target_is_a_config_error(tmp_path: Path, restore_covenant_logger: logging.Logger) -> None:
    with pytest.raises(ConfigError, match="cannot be opened") as info:
        setup_logging(LogSettings("info", "logfmt", f"file:{tmp_path}/missing-dir/d.log"))
    assert "--log-target" in info.value.message


def test_unwritable_file_as_unprivileged_user(tmp_path: Path) -> None:
    """Root can write anywhere: switch uid in a child to test permissions for real."""
    target = tmp_path / "root-only.log"
    target.write_text("")
    target.chmod(0o600)
    code = textwrap.dedent(
        f"""
        import os
        # Import first: the interpreter's own files may not be readable by nobody.
        from covenant.logs import LogSettings, setup_logging
        from covenant.errors import ConfigError
        os.setgid(65534); os.setuid(65534)
        try:
            setup_logging(LogSettings("info", "logfmt", "file:{target}"))
        except ConfigError as exc:
            print("ConfigError:", exc.message)
        """
    )
    tmp_path.chmod(0o755)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "ConfigError: log target file:" in out.stdout and "Permission denied" in out.stdout, out


CHILD_LOGGER = textwrap.dedent(
    """
    import logging, os, sys
    from covenant.logs import LogSettings, setup_logging
    if sys.argv[1] == "match":
        st = os.fstat(2)
        os.environ["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
    elif sys.argv[1] == "other":
        os.environ["JOURNAL_STREAM"] = "1:2"
    setup_logging(LogSettings("debug", sys.argv[2], "stderr"))
    log = logging.getLogger("covenant.daemon")
    log.debug("d"); log.info("i", extra={"agent": "a"}); log.warning("w"); log.error("e"); log.critical("c")
    logging.getLogger("covenant.runtime").info("agent stderr", extra={"agent": "a9", "intent": "i9", "line": "x y"})
    """
)


def run_child_logger(mode: str, fmt: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD_LOGGER, mode, fmt],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    return out.stderr.splitlines()


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_journal_stream_gives_priority_prefixes(fmt: str) -> None:
    lines = run_child_logger("match", fmt)
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<2>", "<6>"], lines
    bodies = [line[3:] for line in lines]
    parsed = [json.loads(b) if fmt == "json" else parse_logfmt(b) for b in bodies]
    assert [p["msg"] for p in parsed[:5]] == ["d", "i", "w", "e", "c"]
    assert (parsed[5]["agent"], parsed[5]["intent"], parsed[5]["line"]) == ("a9", "i9", "x y")


@pytest.mark.parametrize("mode", ["none", "other"])
def test_no_prefix_unless_journal_stream_is_our_stderr(mode: str) -> None:
    lines = run_child_logger(mode, "logfmt")
    assert len(lines) == 6
    for line in lines:
        assert not line.startswith("<")
        assert parse_logfmt(line)["logger"].startswith("covenant.")


def test_stdout_target_and_no_propagation_to_root() -> None:
    code = textwrap.dedent(
        """
        import logging
        logging.basicConfig(level=logging.DEBUG)   # a root handler must not print our lines twice
        from covenant.logs import LogSettings, setup_logging
        setup_logging(LogSettings("info", "json", "stdout"))
        logging.getLogger("covenant.x").info("hello", extra={"intent": "i1"})
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stderr == "", out.stderr
    assert json.loads(out.stdout)["intent"] == "i1", out.stdout


def test_a_file_target_is_readable_by_the_daemon_and_its_group_only(
    tmp_path: Path, restore_covenant_logger: logging.Logger
) -> None:
    """0640 with the daemon's group, 0600 otherwise; a 0644 file of its own is narrowed, at the reopen after a
    logrotate too (an agent read another agent's stderr from a 0644 log)."""
    log_file = tmp_path / "d.log"
    setup_logging(LogSettings("info", "logfmt", f"file:{log_file}"))
    logging.getLogger("covenant.runtime").info("agent stderr", extra={"line": "DB_PASSWORD=hunter2"})
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o640 and log_file.stat().st_gid == os.getegid()
    log_file.rename(tmp_path / "d.log.1")  # logrotate moves it; the next line reopens the path
    log_file.write_text("")
    log_file.chmod(0o644)
    logging.getLogger("covenant.runtime").info("after rotation")
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o640
    assert "after rotation" in log_file.read_text()
    if os.geteuid() == 0:
        other = tmp_path / "other-group.log"
        other.write_text("")
        os.chown(other, 0, 12345)
        other.chmod(0o664)
        setup_logging(LogSettings("info", "logfmt", f"file:{other}"))
        assert stat.S_IMODE(other.stat().st_mode) == 0o600  # not the daemon's group: nobody else


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another uid needs root to make")
def test_a_file_target_others_may_read_and_the_daemon_cannot_narrow_is_refused(agent_reachable_dir: Path) -> None:
    target = agent_reachable_dir / "theirs.log"
    target.write_text("")
    os.chown(target, 62121, 62121)
    target.chmod(0o666)
    code = textwrap.dedent(f"""
        from covenant.errors import ConfigError
        from covenant.logs import LogSettings, setup_logging
        try:
            setup_logging(LogSettings("info", "logfmt", "file:{target}"))
        except ConfigError as exc:
            print(exc.message)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, user=62122,
                          group=62122, extra_groups=[], cwd=REPO_ROOT)
    assert "others may read it" in done.stdout, done.stdout + done.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o666
