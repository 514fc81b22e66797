"""covenant.toml: the daemon's configuration, every key with a working default.

Unknown keys are errors (a typo must not silently fall back to a default).
Documented in docs/configuration.md; keep the two in step.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from covenant.errors import ConfigError
from covenant.home import Home

__all__ = [
    "Config",
    "RuntimeConfig",
    "AuditConfig",
    "PolicyConfig",
    "DaemonConfig",
    "LogConfig",
    "load_config",
    "default_python3",
]


def default_python3() -> str:
    """The real interpreter behind this process, not a venv or pyenv shim.

    A pyenv shim costs ~75 ms per spawn; a venv interpreter would hand agents
    covenant's own site-packages. ``sys._base_executable`` is the base install.
    """
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RuntimeConfig(_Section):
    """How agents are spawned and supervised."""

    python3: str = Field(default_factory=default_python3, description="interpreter for runtime = python3")
    node: str = Field("node", description="interpreter for runtime = node (resolved on the agent PATH)")
    path: str = Field("/usr/local/bin:/usr/bin:/bin", description="PATH given to agents")
    env_allow: tuple[str, ...] = Field((), description="names of daemon env vars passed through to agents")
    env: dict[str, str] = Field(default_factory=dict, description="fixed variables set for every agent")
    stdout_cap_bytes: int = Field(1024 * 1024, gt=0, le=1 << 30)
    stderr_tail_bytes: int = Field(8192, gt=0, le=1 << 24)
    kill_grace_ms: int = Field(2000, ge=0, le=600_000)
    sample_interval_ms: int = Field(50, ge=5, le=10_000)
    network_enforcement: Literal["strict", "advisory"] = "strict"
    wall_grace_ms: int = Field(
        500, ge=0, le=3_600_000, description="wall-clock budget = cpu_ms_per_task + this (docs/runtime.md)"
    )
    pdeathsig: bool = Field(
        True, description="start agents through a PR_SET_PDEATHSIG=SIGKILL wrapper (docs/runtime.md)"
    )


class AuditConfig(_Section):
    """The signed audit log (design/audit-log.md)."""

    batch_max: int = Field(512, gt=0, le=100_000, description="most records under one checkpoint and one fdatasync")
    batch_wait_ms: int = Field(
        0,
        ge=0,
        le=1000,
        description="extra wait to grow a batch; 0 = none (records still group while the previous batch syncs)",
    )
    heartbeat_s: int = Field(60, gt=0, le=86_400, description="idle seconds before a heartbeat checkpoint")
    segment_bytes: int = Field(64 * 1024 * 1024, ge=4096, description="start a new segment file after this size")
    store_text: bool = Field(False, description="store intent/result text whole instead of sha256+length")
    pubkey: str | None = Field(None, description="pinned daemon public key (hex) for verify")


class PolicyConfig(_Section):
    """Signed intents and grants."""

    skew_s: int = Field(300, gt=0, le=86_400, description="accepted clock skew of issued_at, seconds")
    replay_cache: int = Field(100_000, gt=0, le=10_000_000, description="intent ids remembered for replay checks")


class DaemonConfig(_Section):
    """Concurrency, queueing and shutdown."""

    max_concurrent: int = Field(default_factory=lambda: (os.cpu_count() or 1) * 4, gt=0, le=10_000)
    per_agent_concurrent: int = Field(0, ge=0, le=10_000, description="0 = only the global limit")
    queue_max: int = Field(1000, ge=0, le=1_000_000)
    drain_timeout_s: float = Field(30, ge=0, le=86_400)


class LogConfig(_Section):
    """Daemon log output."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["logfmt", "json"] = "logfmt"
    target: str = Field("stderr", description="stderr, stdout or file:PATH")


class Config(_Section):
    """Top level of covenant.toml."""

    # Validated here so a wrong type is reported with the rest; resolved to paths by
    # covenant.home.Home (which the pydantic-free `covenant dispatch` path also uses).
    agents_dir: str = Field("agents", min_length=1)
    socket: str = Field("covenant.sock", min_length=1)
    default_agent: str | None = None
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    daemon: DaemonConfig = Field(default_factory=DaemonConfig)
    log: LogConfig = Field(default_factory=LogConfig)


def load_config(home: Home) -> Config:
    """Load and validate ``<home>/covenant.toml``.

    Each problem names the file, the line, the key and what to write instead
    (for an unknown key: the accepted keys of its table), in covenant's words.
    """
    raw = home.raw_config()
    try:
        # Strict, through JSON: TOML values keep their types, so "5" is not an integer and "yes" is not
        # a boolean (a lax coercion would hide a mistake); JSON mode still reads arrays as tuples.
        return Config.model_validate_json(json.dumps(raw, default=str), strict=True)
    except ValidationError as exc:
        try:
            text = home.config_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        problems = sorted((_problem(home, text, err) for err in exc.errors()), key=_line_of)
        raise ConfigError(
            "\n".join(text for _, text in problems) + "\n(docs/configuration.md lists every key; fix the file and start again)",
            path=str(home.config_path),
        ) from None


_TABLES: dict[str, type[_Section]] = {
    "runtime": RuntimeConfig,
    "audit": AuditConfig,
    "policy": PolicyConfig,
    "daemon": DaemonConfig,
    "log": LogConfig,
}
_BOUNDS = {"gt": "greater than", "ge": "at least", "lt": "less than", "le": "at most"}


def _describe(err: Any, model: type[_Section]) -> str:
    """What is wrong with one value, and what to write instead, without pydantic's wording."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err["input"]
    got = f"got {value!r}"
    if kind == "extra_forbidden":
        accepted = list(model.model_fields)
        close = difflib.get_close_matches(str(err["loc"][-1]), accepted, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"unknown key ({hint}accepted keys here: {', '.join(accepted)})"
    if kind in ("model_type", "dict_type"):
        return f"must be a table, {got}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"must be an integer (written without quotes), {got}"
    if kind in ("float_parsing", "float_type"):
        return f"must be a number (written without quotes), {got}"
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false (without quotes), {got}"
    if kind == "string_type":
        return f"must be a string in quotes, {got}"
    if kind in ("tuple_type", "list_type"):
        return f'must be an array of strings, like ["A", "B"], {got}'
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, {got}"
    if kind in ("string_too_short", "too_short"):
        return "must not be empty"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound = next(k for k in _BOUNDS if k in ctx)
        return f"must be {_BOUNDS[bound]} {ctx[bound]}, {got}"
    return f"is not valid ({err['msg'].lower()}), {got}"


def _line_of(problem: tuple[int | None, str]) -> int:
    return problem[0] or 0


def _problem(home: Home, text: str, err: Any) -> tuple[int | None, str]:
    """(line, ``path:line: [table] key: what is wrong``)."""
    from covenant.manifest.agent_toml import key_line  # the manifest parser's TOML line finder

    loc = [str(part) for part in err["loc"]]
    table = loc[0] if len(loc) > 1 and loc[0] in _TABLES else None
    key = loc[1] if table else loc[0]
    model = _TABLES[table] if table else Config
    line = key_line(text, table, key) if text else None
    where = f"{home.config_path}:{line}" if line else str(home.config_path)
    field = f"[{table}] {'.'.join(loc[1:])}" if table else ".".join(loc)
    return line, f"{where}: {field}: {_describe(err, model)}"
