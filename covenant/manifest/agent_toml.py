"""``agent.toml``: read with stdlib tomllib, validated by hand, turned into an AgentSpec.

Validation is hand-written rather than delegated to pydantic so that each
message names the field, the value and the fix, and so that a folder of a
thousand manifests checks in a fraction of a second. Line numbers of field
problems are found by a small scan of the text, done only when a problem
exists (tomllib gives lines for syntax errors only).
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any

from covenant.spawned_ids import is_spawned_id
from covenant.manifest.limits import (
    DEFAULT_LIMITS,
    MAX_DEPTH,
    ManifestLimits,
    ManifestTooLarge,
    read_capped,
    toml_depth_problem,
)
from covenant.manifest.model import (
    MAX_CPU_MS,
    MAX_DISK_MB,
    MAX_MEMORY_MB,
    AgentSpec,
    Capabilities,
    Resources,
    Settlement,
)
from covenant.manifest.problems import ManifestError, Problem
from covenant.outside_json import nests_deeper
from covenant.actions import action_problem
from covenant.priorities import PRIORITIES
from covenant.toml_lines import key_line

__all__ = ["load_agent_toml", "parse_agent_toml", "normalize_agent_id", "ID_PATTERN"]

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}@[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")
"""``name@host``: letters, digits, ``.``, ``_``, ``-``; name up to 64, host up to 253 characters."""

_RUNTIMES = ("rust-bin", "python3", "node")
_NETWORKS = ("off", "outbound-https-only", "full")
_AGENT_KEYS = ("id", "name", "version", "runtime", "entry")
_KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    "agent": _AGENT_KEYS,
    "capabilities": ("required", "optional"),
    "resources": ("cpu_ms_per_task", "memory_mb", "disk_mb", "network"),
    "settlement": ("budget_credits_per_hour", "priority"),
    "routing": ("keywords",),
}
# (minimum, maximum) of each integer field; minimum is inclusive.
_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "cpu_ms_per_task": (1, MAX_CPU_MS),
    "memory_mb": (1, MAX_MEMORY_MB),
    "disk_mb": (1, MAX_DISK_MB),
    "budget_credits_per_hour": (0, 10**12),
}
_TOML_LINE = re.compile(r"\(at line (\d+), column \d+\)")


def normalize_agent_id(value: str) -> tuple[str, str | None]:
    """``(id, warning)``: a bare ``name`` becomes ``name@local`` with a warning."""
    if "@" in value:
        return value, None
    return f"{value}@local", f"agent.id {value!r} has no @host; read as {value + '@local'!r} (write it in full)"


def _type_name(value: object) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )


class _Checker:
    """Collects problems for one file; a line is looked up only when a problem is recorded."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.text = text
        self.problems: list[Problem] = []

    def add(self, section: str | None, key: str | None, message: str, index: int | None = None) -> None:
        field = ".".join(p for p in (section, key) if p) or None
        if field is not None and index is not None:
            field += f"[{index}]"
        self.problems.append(Problem(self.path, key_line(self.text, section, key), field, message))

    def section(self, raw: dict[str, Any], name: str) -> dict[str, Any]:
        """The table ``[name]`` (empty when absent), with unknown keys reported."""
        table = raw.get(name, {})
        if not isinstance(table, dict):
            self.add(None, name, f"must be a table [{name}], got {_type_name(table)}")
            return {}
        known = _KNOWN_KEYS[name]
        for key in table:
            if key not in known:
                import difflib  # here: only a manifest with an unknown key needs it, not a running daemon

                close = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                self.add(
                    name,
                    key,
                    f"unknown key ({hint}known keys: {', '.join(known)}); "
                    "unknown keys are rejected so a misspelt field never falls back to its default",
                )
        return table

    def string(self, table: dict[str, Any], section: str, key: str) -> str | None:
        if key not in table:
            self.add(section, key, f"required field is missing; add `{key} = \"...\"` under [{section}]")
            return None
        value = table[key]
        if not isinstance(value, str):
            self.add(section, key, f"must be a string, got {_type_name(value)} {value!r}")
            return None
        if not value.strip():
            self.add(section, key, "must not be empty")
            return None
        return value

    def integer(self, table: dict[str, Any], section: str, key: str) -> None:
        if key not in table:
            return
        value = table[key]
        if type(value) is not int:  # bool is an int subclass; "512" and 512.0 are not accepted either
            self.add(section, key, f"must be an integer, got {_type_name(value)} {value!r} (write it without quotes)")
            return
        low, high = _INT_BOUNDS[key]
        if not low <= value <= high:
            self.add(section, key, f"must be between {low} and {high}, got {value}")

    def choice(self, table: dict[str, Any], section: str, key: str, allowed: tuple[str, ...]) -> None:
        if key in table and table[key] not in allowed:
            options = ", ".join(repr(a) for a in allowed)
            self.add(section, key, f"must be one of {options}, got {table[key]!r}")

    def string_list(self, table: dict[str, Any], section: str, key: str) -> list[str]:
        value = table.get(key, [])
        if not isinstance(value, list):
            self.add(section, key, f"must be an array of strings, got {_type_name(value)} {value!r}")
            return []
        good: list[str] = []
        for index, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                self.add(section, key, f"must be a non-empty string, got {item!r}", index)
            else:
                good.append(item)
        return good


def _entry_escape(root: Path, entry: str, path: Path) -> str | None:
    """Why ``entry`` is not inside the package folder ``root``, or None when it is.

    Lexically inside (relative, no ``..``), only a symlink on the way can
    lead out: each component is ``lstat``-ed and the paths are resolved
    only when one is a link (realpath of every entry would cost a scan of
    a thousand manifests a third of its time).
    """
    fix = "; set [runtime] allow_system_entries = true in covenant.toml to run a program outside it"
    if os.path.isabs(entry):
        return f"{entry!r} is an absolute path; entry must be a path inside the package folder {root}{fix}"
    parts = Path(entry).parts
    if ".." in parts:
        return f"{entry!r} climbs out with '..'; entry must be a path inside the package folder {root}{fix}"
    current = root
    for part in parts:
        current = current / part
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                break
        except OSError:
            return None  # missing or unreadable: the existence check says so
    else:
        return None
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        return f"{path} resolves to {real} (a symlink), outside the package folder {real_root}{fix}"
    return None


def _check_entry(checker: _Checker, root: Path, entry: str, runtime: str | None, allow_system: bool) -> Path:
    path = Path(os.path.normpath(root / entry))
    if not allow_system:
        escape = _entry_escape(root, entry, path)
        if escape is not None:
            checker.add("agent", "entry", escape)
            return path
    try:
        st = os.stat(path)
    except FileNotFoundError:
        hint = ""
        if runtime == "rust-bin":
            hint = f"; build it first (e.g. `cargo build --release --manifest-path {root / 'Cargo.toml'}`)"
        checker.add("agent", "entry", f"{path} does not exist{hint}")
        return path
    except OSError as exc:
        checker.add("agent", "entry", f"cannot read {path}: {exc.strerror}")
        return path
    if not stat.S_ISREG(st.st_mode):
        checker.add("agent", "entry", f"{path} is not a regular file")
    elif runtime == "rust-bin" and not (st.st_mode & 0o111 and os.access(path, os.X_OK)):
        checker.add("agent", "entry", f"{path} is not executable (chmod 0755 it)")
    elif runtime in ("python3", "node") and not os.access(path, os.R_OK):
        checker.add("agent", "entry", f"{path} is not readable")
    return path


def parse_agent_toml(
    raw: dict[str, Any], path: Path, text: str, limits: ManifestLimits = DEFAULT_LIMITS
) -> AgentSpec:
    """Validate a parsed agent.toml; ``text`` is used only to locate problems."""
    checker = _Checker(path, text)
    warnings: list[str] = []
    extra: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in _KNOWN_KEYS:
            extra[name] = value
            warnings.append(f"unknown top-level section [{name}] kept for forward compatibility; covenant ignores it")

    agent_id: str | None = None
    entry: Path | None = None
    if "agent" not in raw:
        checker.add(None, "agent", "the [agent] section is missing; it needs id, name, version, runtime and entry")
        agent: dict[str, Any] = {}
    else:
        agent = checker.section(raw, "agent")
        if isinstance(raw["agent"], dict):
            fields = {key: checker.string(agent, "agent", key) for key in _AGENT_KEYS}
            if fields["id"] is not None:
                agent_id, warning = normalize_agent_id(fields["id"])
                if warning:
                    warnings.append(warning)
                if not ID_PATTERN.match(agent_id):
                    checker.add(
                        "agent",
                        "id",
                        f"{fields['id']!r} is not a valid id: write name@host using letters, digits, '.', '_' or '-'",
                    )
                elif is_spawned_id(agent_id):
                    checker.add("agent", "id", f"{fields['id']!r}: the namespace spawned is reserved for agents "
                                               "made by rune@agent-spawn; pick another host part")
            if fields["runtime"] is not None and fields["runtime"] not in _RUNTIMES:
                options = ", ".join(repr(r) for r in _RUNTIMES)
                checker.add("agent", "runtime", f"must be one of {options}, got {fields['runtime']!r}")
            if fields["entry"] is not None:
                entry = _check_entry(
                    checker, path.parent, fields["entry"], fields["runtime"], limits.allow_system_entries
                )

    caps = checker.section(raw, "capabilities")
    actions: dict[str, list[str]] = {}
    for key in ("required", "optional"):
        actions[key] = checker.string_list(caps, "capabilities", key)
        for index, action in enumerate(actions[key]):
            problem = action_problem(action)
            if problem is not None:
                checker.add("capabilities", key, problem, index)

    resources = checker.section(raw, "resources")
    for key in ("cpu_ms_per_task", "memory_mb", "disk_mb"):
        checker.integer(resources, "resources", key)
    checker.choice(resources, "resources", "network", _NETWORKS)

    settlement = checker.section(raw, "settlement")
    checker.integer(settlement, "settlement", "budget_credits_per_hour")
    checker.choice(settlement, "settlement", "priority", PRIORITIES)

    keywords = checker.string_list(checker.section(raw, "routing"), "routing", "keywords")

    if checker.problems:
        raise ManifestError(sorted(checker.problems, key=lambda p: p.line or 0))
    return AgentSpec(
        id=agent_id,
        name=agent["name"],
        version=agent["version"],
        runtime=agent["runtime"],
        kind="agent.toml",
        manifest_path=path,
        root=path.parent,
        entry=entry,
        capabilities=Capabilities(required=tuple(actions["required"]), optional=tuple(actions["optional"])),
        resources=Resources(**resources),
        settlement=Settlement(**settlement),
        keywords=tuple(keywords),
        warnings=tuple(warnings),
        extra_sections=extra,
    )


def load_agent_toml(path: Path, limits: ManifestLimits = DEFAULT_LIMITS) -> AgentSpec:
    """Read and validate one agent.toml (or ``*.toml``); raises ManifestError with every problem.

    Size and nesting are bounded before and after parsing (see
    :mod:`covenant.manifest.limits`): a hostile file is one rejected manifest.
    """
    path = Path(os.path.abspath(path))
    try:
        data = read_capped(path, limits.max_bytes)
    except ManifestTooLarge as exc:
        raise ManifestError([Problem(path, None, None, str(exc))]) from None
    except OSError as exc:
        raise ManifestError([Problem(path, None, None, f"io error: cannot read the manifest: {exc.strerror}")]) from None
    try:
        text = data.decode("utf-8")
        deep = toml_depth_problem(text)
        if deep is not None:
            raise ManifestError([Problem(path, deep[0], None, deep[1])])
        raw = tomllib.loads(text)
    except RecursionError:  # not reachable past the depth scan; kept so no TOML text can take the scan down
        raise ManifestError([Problem(path, None, None, "parse error: nested too deep to parse; refused")]) from None
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ManifestError([Problem(path, line, None, f"parse error: not UTF-8 text ({exc.reason} at byte {exc.start})")]) from None
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_LINE.search(str(exc))
        message = _TOML_LINE.sub("", str(exc)).strip()
        raise ManifestError(
            [Problem(path, int(found.group(1)) if found else None, None, f"parse error: {message}; fix the TOML syntax")]
        ) from None
    if nests_deeper(raw, MAX_DEPTH):
        raise ManifestError(
            [
                Problem(
                    path,
                    None,
                    None,
                    f"parse error: tables nest deeper than {MAX_DEPTH} levels (table headers or dotted keys); "
                    "refused (real manifests nest a few levels)",
                )
            ]
        )
    return parse_agent_toml(raw, path, text, limits)
