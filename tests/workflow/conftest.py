"""Real daemons with several Rune agents (and workflows) on the scripted fake model provider."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.rune.conftest import KEY_ENV, KEY_VALUE, configure

CORPUS = Path("/work/shared/corpus/rune-examples")
if not CORPUS.is_dir():
    CORPUS = Path(__file__).resolve().parents[2] / "examples" / "rune"


def rune_agent(d: DaemonProcess, name: str, *, folder: Path | None = None, toolset: tuple[str, ...] = (),
               tools: str = "", networks: tuple[str, ...] = ("bridge",), timeout_ms: int = 60_000,
               concurrency: int = 8) -> Path:
    """A Rune package under agents/ (or ``folder``) whose provider is the fake."""
    root = (folder or d.home / "agents") / name
    root.mkdir(parents=True, exist_ok=True)
    (root / "Runefile").write_text(
        f"name: {name}\n"
        "version: 0.1.0\n"
        f"instructions: You are the covenant test agent {name}.\n"
        "default_model: default\n"
        f"toolset: {json.dumps(list(toolset))}\n"
        "max_steps: 8\n"
        f"timeout_ms: {timeout_ms}\n"
        f"networks: {json.dumps(list(networks))}\n"
        + (textwrap.dedent(tools) if tools else "")
        + "runtime:\n"
        f"  concurrency_limit: {concurrency}\n"
        "models:\n"
        '  providers: ["fake"]\n'
        "  model_mapping:\n"
        "    default: fake-model\n"
    )
    return root


def agent_tool(name: str, agent: str, *, timeout_ms: int, max_depth: int | None = None) -> str:
    """A Runefile ``tools:`` block with one ``runtime: agent`` tool ``name`` calling ``local://agent``."""
    depth = f"    max_depth: {max_depth}\n" if max_depth is not None else ""
    return f"tools:\n  - name: {name}\n    runtime: agent\n    agent_ref: local://{agent}\n{depth}    timeout_ms: {timeout_ms}\n"


def copy_multi_agent(d: DaemonProcess) -> Path:
    target = d.home / "agents" / "multi-agent"
    shutil.copytree(CORPUS / "multi-agent", target)
    subprocess.run(["chmod", "-R", "go-w,a+rX", str(target)], check=True)
    return target


def audit(d: DaemonProcess, *types: str) -> list[dict[str, Any]]:
    result = d.cli("audit", "tail", "--json", "-n", "1000000", check=True)
    records = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return [r for r in records if not types or r["type"] in types]


def record(d: DaemonProcess, intent_id: str) -> dict[str, Any]:
    return json.loads(d.cli("show", intent_id, "--json", check=True).stdout)


__all__ = ["rune_agent", "copy_multi_agent", "audit", "record", "configure", "KEY_ENV", "KEY_VALUE"]
