"""Benchmark: `covenant agents check` over 1,000 valid and 100 invalid manifests.

Acceptance bar (issue 2): the real CLI subprocess reports all 100 problems
with file and field (or line, for TOML syntax errors), exits 1, and finishes
in under 2 s wall on a 2-core box. Also timed: the in-process
``scan_agents`` alone, against a raw baseline (read + tomllib.loads of the
same files, no validation) measured in the same process.

Run: .venv/bin/python bench/agents_check.py
``generate()`` is reused by tests/manifest/test_bench_corpus.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent

_BASE: dict[str, dict[str, str]] = {
    "agent": {
        "id": '"{id}"',
        "name": '"{name}"',
        "version": '"0.1.0"',
        "runtime": '"python3"',
        "entry": '"agent.py"',
    },
    "capabilities": {"required": '["tool.text_stats"]', "optional": '["memory.read"]'},
    "resources": {"cpu_ms_per_task": "5000", "memory_mb": "64", "disk_mb": "10", "network": '"off"'},
    "settlement": {"budget_credits_per_hour": "0", "priority": '"normal"'},
    "routing": {"keywords": '["bench", "count"]'},
}

Sections = dict[str, dict[str, str]]
# A mutation edits the sections, or the rendered text, or both; it names the field expected in the problem
# (None for TOML syntax errors, which carry a line instead).
Mutation = tuple[str, Callable[[Sections], None] | None, Callable[[str], str] | None, str | None]


def _set(section: str, key: str, literal: str) -> Callable[[Sections], None]:
    def edit(s: Sections) -> None:
        s[section][key] = literal

    return edit


def _del(section: str, key: str) -> Callable[[Sections], None]:
    def edit(s: Sections) -> None:
        del s[section][key]

    return edit


def _drop_section(section: str) -> Callable[[Sections], None]:
    def edit(s: Sections) -> None:
        del s[section]

    return edit


def _prepend(line: str) -> Callable[[str], str]:
    return lambda text: line + "\n" + text


def _replace(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        if old not in text:
            raise ValueError(f"mutation target {old!r} not in the manifest")
        return text.replace(old, new, 1)

    return edit


def mutations() -> list[Mutation]:
    """100 different ways to break a manifest, each with the field its problem must name."""
    out: list[Mutation] = []
    agent_keys = ("id", "name", "version", "runtime", "entry")
    for key in agent_keys:
        out.append((f"missing agent.{key}", _del("agent", key), None, f"agent.{key}"))
        out.append((f"empty agent.{key}", _set("agent", key, '""'), None, f"agent.{key}"))
        out.append((f"blank agent.{key}", _set("agent", key, '"   "'), None, f"agent.{key}"))
        out.append((f"integer agent.{key}", _set("agent", key, "7"), None, f"agent.{key}"))
        out.append((f"boolean agent.{key}", _set("agent", key, "true"), None, f"agent.{key}"))
        out.append((f"array agent.{key}", _set("agent", key, '["x"]'), None, f"agent.{key}"))
    for bad_id in ('"bad id!@local"', '"@local"', '"x@"'):
        out.append((f"bad id {bad_id}", _set("agent", "id", bad_id), None, "agent.id"))
    for runtime in ('"python"', '"rust"', '"Node"', '"rune"'):
        out.append((f"runtime {runtime}", _set("agent", "runtime", runtime), None, "agent.runtime"))
    out.append(("entry missing", _set("agent", "entry", '"missing.py"'), None, "agent.entry"))
    out.append(("entry is a folder", _set("agent", "entry", '"."'), None, "agent.entry"))
    out.append(
        (
            "rust-bin entry not executable",
            lambda s: s["agent"].update(runtime='"rust-bin"'),
            None,
            "agent.entry",
        )
    )
    out.append(("entry absolute missing", _set("agent", "entry", '"/nonexistent/agent"'), None, "agent.entry"))
    for typo in ("idd", "entrypoint", "descripton", "namee"):
        out.append((f"unknown agent.{typo}", _set("agent", typo, '"x"'), None, f"agent.{typo}"))
    for action in ('"foo.bar"', '"tool"', '"tool."', '"Tool.x"'):
        out.append((f"required {action}", _set("capabilities", "required", f"[{action}]"), None, "capabilities.required[0]"))
    for action in ('"net.read"', '"memory"', '".write"', '"memory.Write"'):
        out.append((f"optional {action}", _set("capabilities", "optional", f"[{action}]"), None, "capabilities.optional[0]"))
    out.append(("required is a string", _set("capabilities", "required", '"tool.a"'), None, "capabilities.required"))
    out.append(("required holds an integer", _set("capabilities", "required", "[1]"), None, "capabilities.required[0]"))
    out.append(("optional holds an empty string", _set("capabilities", "optional", '[""]'), None, "capabilities.optional[0]"))
    out.append(("unknown capabilities.requires", _set("capabilities", "requires", "[]"), None, "capabilities.requires"))
    out.append(("capabilities is a scalar", _drop_section("capabilities"), _prepend("capabilities = 5"), "capabilities"))
    for key, values in {
        "cpu_ms_per_task": ("0", "-5", "1000000000000", "1.5"),
        "memory_mb": ("0", '"512"', "512.0"),
        "disk_mb": ("-1", "true", "1000000000"),
        "network": ('"none"', '"OFF"', "1", '"outbound-https"'),
    }.items():
        for value in values:
            out.append((f"resources.{key} = {value}", _set("resources", key, value), None, f"resources.{key}"))
    for typo in ("memroy_mb", "cpu_ms", "networking"):
        out.append((f"unknown resources.{typo}", _set("resources", typo, "1"), None, f"resources.{typo}"))
    for value in ("-1", '"0"', "10000000000000"):
        out.append((f"budget {value}", _set("settlement", "budget_credits_per_hour", value), None, "settlement.budget_credits_per_hour"))
    for value in ('"urgent"', '""', "2"):
        out.append((f"priority {value}", _set("settlement", "priority", value), None, "settlement.priority"))
    out.append(("unknown settlement.priorty", _set("settlement", "priorty", '"high"'), None, "settlement.priorty"))
    out.append(("keywords is a string", _set("routing", "keywords", '"x"'), None, "routing.keywords"))
    out.append(("keywords holds an empty string", _set("routing", "keywords", '[""]'), None, "routing.keywords[0]"))
    out.append(("keywords holds an integer", _set("routing", "keywords", "[1]"), None, "routing.keywords[0]"))
    out.append(("unknown routing.keyword", _set("routing", "keyword", '["x"]'), None, "routing.keyword"))
    out.append(("routing is a scalar", _drop_section("routing"), _prepend('routing = "x"'), "routing"))
    out.append(("no [agent] section", _drop_section("agent"), None, "agent"))
    out.append(("agent is a scalar", _drop_section("agent"), _prepend('agent = "x"'), "agent"))
    # TOML syntax errors: no field, a line.
    out.append(("unterminated string", None, _replace('version = "0.1.0"', 'version = "0.1.0'), None))
    out.append(("missing =", None, _replace('version = "0.1.0"', 'version "0.1.0"'), None))
    out.append(("duplicate key", None, _replace("memory_mb = 64", "memory_mb = 64\nmemory_mb = 65"), None))
    out.append(("duplicate section", None, lambda t: t + "\n[agent]\nx = 1\n", None))
    out.append(("unclosed header", None, _replace("[resources]", "[resources"), None))
    out.append(("two values", None, _replace("memory_mb = 64", "memory_mb = 64 64"), None))
    out.append(("bad escape", None, _replace('version = "0.1.0"', 'version = "0.1\\q"'), None))
    out.append(("no key", None, _replace("disk_mb = 10", "= 10"), None))
    out.append(("unclosed array", None, _replace('required = ["tool.text_stats"]', 'required = ["tool.text_stats"'), None))
    out.append(("bare dotted version", None, _replace('version = "0.1.0"', "version = 1.2.3"), None))
    out.append(("not UTF-8", None, lambda t: t.replace("bench", "b\udcffnch"), None))
    return out


def render(sections: Sections, agent_id: str) -> str:
    lines: list[str] = []
    for section, keys in sections.items():
        lines.append(f"[{section}]")
        for key, literal in keys.items():
            lines.append(f"{key} = {literal}".replace("{id}", agent_id).replace("{name}", agent_id.split("@")[0]))
        lines.append("")
    return "\n".join(lines)


def _write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))


def generate(folder: Path, valid: int = 1000, packages: int = 100) -> dict[Path, str | None]:
    """Write ``valid`` good manifests (``packages`` of them as <dir>/agent.toml) and 100 broken ones.

    Returns each broken file -> the field its problem must name (None: a syntax error, located by line).
    """
    (folder / "agent.py").write_text("print('bench')\n")
    for n in range(valid):
        agent_id = f"agent-{n:04d}@local"
        if n < packages:
            pkg = folder / f"pkg-{n:04d}"
            pkg.mkdir()
            (pkg / "agent.py").write_text("print('bench')\n")
            _write(pkg / "agent.toml", render(_BASE, agent_id))
        else:
            _write(folder / f"agent-{n:04d}.toml", render(_BASE, agent_id))
    broken: dict[Path, str | None] = {}
    for n, (_, edit_sections, edit_text, field) in enumerate(mutations()):
        sections = {name: dict(keys) for name, keys in _BASE.items()}
        if edit_sections is not None:
            edit_sections(sections)
        text = render(sections, f"broken-{n:03d}@local")
        if edit_text is not None:
            text = edit_text(text)
        path = folder / f"broken-{n:03d}.toml"
        _write(path, text)
        broken[path] = field
    return broken


def _time(fn: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    from covenant.manifest.registry import scan_agents

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "agents"
        folder.mkdir()
        broken = generate(folder)
        assert len(broken) == 100 and len(set(name for name, *_ in mutations())) == 100
        covenant = str(REPO / ".venv" / "bin" / "covenant")
        env = {**os.environ, "COVENANT_HOME": str(Path(tmp) / "home")}

        walls: list[float] = []
        for _ in range(3):
            start = time.perf_counter()
            proc = subprocess.run([covenant, "agents", "check", str(folder)], capture_output=True, text=True, env=env)
            walls.append(time.perf_counter() - start)
        lines = proc.stdout.splitlines()
        reported = {line.split(":", 1)[0] for line in lines}
        all_reported = reported == {str(p) for p in broken}

        files = sorted(folder.glob("*.toml")) + sorted(folder.glob("*/agent.toml"))

        def raw() -> None:
            for f in files:
                try:
                    tomllib.loads(f.read_bytes().decode("utf-8"))
                except (tomllib.TOMLDecodeError, UnicodeDecodeError):
                    pass

        registry = scan_agents(folder)
        scan_s = _time(lambda: scan_agents(folder))
        raw_s = _time(raw)
        version = subprocess.run([covenant, "--version"], capture_output=True, env=env)
        start = time.perf_counter()
        subprocess.run([covenant, "--version"], capture_output=True, env=env)
        startup_s = time.perf_counter() - start

    ok = proc.returncode == 1 and all_reported and max(walls) < 2.0
    print(f"manifests: 1000 valid + 100 invalid ({len(files)} files)")
    print(f"covenant agents check (subprocess): best {min(walls):.3f} s, worst {max(walls):.3f} s wall (bar: < 2 s)")
    print(f"  exit code {proc.returncode} (want 1); {len(lines)} problem lines covering {len(reported)} files; all 100 reported: {all_reported}")
    print(f"  of which CLI start-up (`covenant --version`): {startup_s:.3f} s (rc {version.returncode})")
    print(f"scan_agents in-process: {scan_s * 1000:.1f} ms ({len(registry.agents)} agents, {len(registry.problems)} problems)")
    print(f"raw baseline (read + tomllib.loads only): {raw_s * 1000:.1f} ms; scan/raw = {scan_s / raw_s:.2f}x")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
