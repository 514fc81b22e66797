"""Helpers for the audit tests: real logs written by the real writer, edited on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.format import line_hash
from covenant.audit.writer import AuditLog
from covenant.canonical import canonical_bytes
from covenant.cli.group import cli
from covenant.config import AuditConfig
from covenant.home import Home
from covenant.keys import create_key_file, public_key_hex


async def write_events(
    directory: Path,
    key: Ed25519PrivateKey,
    sequential: int = 0,
    concurrent: int = 0,
    agent: str = "echo",
    **config: Any,
) -> None:
    """Write ``sequential`` events of ``agent`` one by one (one checkpoint each), then ``concurrent`` at once (one
    batch of up to ``batch_max``)."""
    async with AuditLog.open(directory, key, AuditConfig(**config)) as log:
        for n in range(sequential):
            await log.record("agent.exited", {"agent": agent, "intent": f"i{n}", "outcome": "ok", "n": n})
        if concurrent:
            await log.record_many(
                [("intent.received", {"agent": "batch", "intent": f"b{n}", "n": n}) for n in range(concurrent)]
            )


def write_events_sync(directory: Path, key: Ed25519PrivateKey, sequential: int = 0, concurrent: int = 0,
                      agent: str = "echo", **config: Any) -> None:
    trio.run(lambda: write_events(directory, key, sequential, concurrent, agent, **config))


def segment(directory: Path, index: int = 0) -> Path:
    return directory / f"audit-{index:06d}.jsonl"


def read_lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def rechain(lines: list[bytes], start: int) -> list[bytes]:
    """Recompute every ``prev`` from ``start`` on, as an attacker hiding an edit would."""
    out = list(lines)
    for i in range(start, len(out)):
        rec = json.loads(out[i])
        rec["prev"] = line_hash(out[i - 1])
        out[i] = canonical_bytes(rec)
    return out


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def home_with_key(home: Home) -> tuple[Home, Ed25519PrivateKey]:
    """A home whose identity/daemon.key exists (what `covenant init` creates)."""
    return home, create_key_file(home.daemon_key_path)


def run_verify(home: Home, *args: str) -> tuple[int, str]:
    """`covenant audit verify` in-process; returns (exit code, output)."""
    result = CliRunner().invoke(cli, ["--home", str(home.root), "audit", "verify", *args])
    return result.exit_code, result.output


def pubkey_arg(key: Ed25519PrivateKey) -> list[str]:
    return ["--pubkey", public_key_hex(key)]
