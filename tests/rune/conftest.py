"""A real daemon with Rune agents whose provider is the scripted fake model server."""

from __future__ import annotations

import json
import secrets
import textwrap
from pathlib import Path

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.fakes import FakeModelServer

KEY_ENV = "FAKE_PROVIDER_KEY"
# Unique per test session: the /proc scan for it must not find another run's daemon on the same box.
KEY_VALUE = "sk-test-" + secrets.token_hex(16)


def add_rune_agent(d: DaemonProcess, name: str = "chat", *, toolset: tuple[str, ...] = ("rune@system-time",),
                   providers: tuple[str, ...] = ("fake",), max_steps: int = 4, token_budget: int = 100_000,
                   timeout_ms: int = 60_000, memory_profile: str = "standard", runtime: str = "",
                   safety: str = "standard") -> Path:
    """Install a Rune package <home>/agents/<name>/Runefile."""
    folder = d.home / "agents" / name
    folder.mkdir(parents=True, exist_ok=True)
    runtime_block = textwrap.indent(textwrap.dedent(runtime).strip(), "  ") if runtime else \
        "  startup_timeout_ms: 30000\n  health_probe:\n    path: /health\n    interval_ms: 1000"
    (folder / "Runefile").write_text(
        f"name: {name}\n"
        "version: 0.1.0\n"
        "instructions: You are a covenant test agent.\n"
        "default_model: default\n"
        f"toolset: {json.dumps(list(toolset))}\n"
        f"max_steps: {max_steps}\n"
        f"timeout_ms: {timeout_ms}\n"
        f"memory_profile: {memory_profile}\n"
        "runtime:\n"
        f"{runtime_block}\n"
        "models:\n"
        f"  providers: {json.dumps(list(providers))}\n"
        "  model_mapping:\n"
        "    default: fake-model\n"
        f"  token_budget: {token_budget}\n"
        f"  safety_policy: {safety}\n"
    )
    return folder


def add_process_tool(package: Path, name: str, source: str) -> None:
    """A ``runtime: process`` tool ``name`` in ``package``: tools/NAME.yaml and tools/NAME.py (``source``),
    readable by agent uids."""
    tools = package / "tools"
    tools.mkdir(mode=0o755, exist_ok=True)
    (tools / f"{name}.yaml").write_text(f"name: {name}\nruntime: process\nmodule: tools/{name}.py\n")
    (tools / f"{name}.py").write_text(source)
    for path in (tools / f"{name}.yaml", tools / f"{name}.py"):
        path.chmod(0o644)


def configure(d: DaemonProcess, *fakes: tuple[str, FakeModelServer], extra: str = "") -> None:
    """covenant.toml with one [providers.NAME] per fake (the first one keyed), and the key in the daemon's env.

    Agent uids come from the daemon's own range (:meth:`DaemonProcess.write_config`).
    """
    tables = [fake.provider_toml(name, api_key_env=KEY_ENV if i == 0 else None, timeout_s=10)
              for i, (name, fake) in enumerate(fakes)]
    d.write_config(extra + "\n" + "\n".join(tables) + "\n")
    d.env[KEY_ENV] = KEY_VALUE


def outcome_of(result) -> dict:  # type: ignore[no-untyped-def]
    assert result.stdout.strip(), f"no output (exit {result.returncode}): {result.stderr}"
    return json.loads(result.stdout)
