"""The echo agents the runner and daemon benchmarks share (tests/runtime/agents)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["AGENTS", "build_rust"]

AGENTS = Path(__file__).resolve().parent.parent / "tests" / "runtime" / "agents"


def build_rust(target: Path) -> Path | None:
    """Build the rust-bin echo agent into ``target``; None when cargo is not installed."""
    cargo = shutil.which("cargo")
    if cargo is None:
        return None
    subprocess.run([cargo, "build", "--quiet", "--release", "--offline", "--manifest-path",
                    str(AGENTS / "echo-rs" / "Cargo.toml"), "--target-dir", str(target)], check=True)
    return target / "release" / "echo-rs"
