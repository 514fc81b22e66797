"""Hostile manifests an operator might drop into agents/ (issue 12): each must be one rejected manifest."""

from __future__ import annotations

import os
from pathlib import Path

from tests.manifest.helpers import VALID_TOML, write_agent

_RUNE_HEAD = "name: {name}\nversion: 0.1.0\ninstructions: x\ndefault_model: d\nmodels:\n  model_mapping:\n    d: m\n"


def _toml(name: str) -> str:
    return VALID_TOML.replace("demo@local", f"{name}@local").replace('name    = "demo"', f'name    = "{name}"')


def _rune(folder: Path, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Runefile").write_text(text)


def alias_bomb() -> str:
    """Billion laughs: nine levels of nine aliases, 9**9 strings once expanded."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, 9):
        prev, cur = chr(ord("a") + level - 1), chr(ord("a") + level)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return _RUNE_HEAD.format(name="bomb") + "routing_hints:\n  " + "\n  ".join(lines) + "\n"


# file or folder name -> (what the problem message must say)
EXPECTED = {
    "bomb": "alias bomb",
    "recursive-alias": "inside its own anchor",
    "yaml-deep": "nested deeper than 64 levels",
    "deep-array": "nested deeper than 64 levels",
    "deep-header": "tables nest deeper than 64 levels",
    "huge": "over the limit of 1048576 bytes",
    "system-entry": "is an absolute path",
    "climbing-entry": "climbs out with '..'",
    "fifo.toml": "not a regular file",
}


def write_hostile(agents: Path, *, huge_mb: int = 50) -> None:
    """Every hostile case of :data:`EXPECTED`, plus the valid agent ``good@local`` beside them."""
    write_agent(agents / "good", _toml("good"))
    _rune(agents / "bomb", alias_bomb())
    _rune(agents / "recursive-alias", _RUNE_HEAD.format(name="recursive-alias") + "routing_hints:\n  x: &x [*x]\n")
    _rune(agents / "yaml-deep", _RUNE_HEAD.format(name="yaml-deep") + "routing_hints:\n  x: " + "[" * 50_000 + "]" * 50_000 + "\n")
    write_agent(agents / "deep-array", _toml("deep-array") + "\n[extra]\nx = " + "[" * 50_000 + "]" * 50_000 + "\n")
    header = ".".join(f"k{i}" for i in range(10_000))
    write_agent(agents / "deep-header", _toml("deep-header") + f"\n[{header}]\nx = 1\n")
    huge = write_agent(agents / "huge", _toml("huge") + "\n[extra]\nblob = \"")
    with open(huge, "a") as out:
        chunk = "x" * (1 << 20)
        for _ in range(huge_mb):
            out.write(chunk)
        out.write('"\n')
    write_agent(agents / "system-entry", _toml("system-entry").replace('"main.py"', '"/bin/sh"'))
    write_agent(agents / "climbing-entry", _toml("climbing-entry").replace('"main.py"', '"../good/main.py"'))
    os.mkfifo(agents / "fifo.toml")
    for folder, dirs, files in os.walk(agents):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o755)
        for name in files:
            if name != "fifo.toml":
                os.chmod(os.path.join(folder, name), 0o644)
    os.chmod(agents / "fifo.toml", 0o644)
    os.chmod(agents, 0o755)


def problem_name(path: Path, agents: Path) -> str:
    """The case a problem belongs to: its first path component under agents/."""
    return path.relative_to(agents).parts[0]
