"""``covenant init``: create a home with safe modes. Idempotent; never overwrites a key."""

from __future__ import annotations

import os
from pathlib import Path

from covenant.home import Home
from covenant.keys import create_key_file, ensure_private_dir

__all__ = ["init_home", "CONFIG_TEMPLATE", "GRANTS_TEMPLATE"]

CONFIG_TEMPLATE = """\
# covenant daemon configuration. Every key is optional; the values shown are the defaults.
# Reference: docs/configuration.md

# agents_dir = "agents"          # manifests; relative paths are inside this home
# socket = "covenant.sock"       # control socket (env COVENANT_SOCKET overrides)
# default_agent = "name@host"    # where intents go when no agent's keywords match

[runtime]
# node = "node"
# path = "/usr/local/bin:/usr/bin:/bin"   # PATH given to agents
# env_allow = []                           # daemon env vars passed through to agents, by name
# stdout_cap_bytes = 1048576
# kill_grace_ms = 2000
# sample_interval_ms = 50
# network_enforcement = "strict"           # "advisory" runs network = "off" agents without a namespace

[audit]
# heartbeat_s = 60
# store_text = false                       # true stores intent and result text whole

[policy]
# skew_s = 300

[daemon]
# queue_max = 1000
# drain_timeout_s = 30

[log]
# level = "info"
# format = "logfmt"
"""

GRANTS_TEMPLATE = """\
# Capability grants, each signed by this home's daemon key.
# Edit with `covenant grant` / `covenant revoke`; a hand-edited entry does not verify and is ignored.
"""


def _mkdir(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)


def _write_new(path: Path, text: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return True


def init_home(home: Home) -> list[str]:
    """Create what is missing in ``home``; return a line per thing created."""
    created: list[str] = []
    if not home.root.exists():
        created.append(f"created {home.root}")
    _mkdir(home.root, 0o755)
    for path, mode in (
        (home.agents_dir, 0o755),
        (home.audit_dir, 0o750),
        (home.state_dir, 0o700),
    ):
        if not path.exists():
            created.append(f"created {path}/")
        _mkdir(path, mode)
    ensure_private_dir(home.identity_dir)
    if not home.daemon_key_path.exists():
        create_key_file(home.daemon_key_path)
        created.append(f"created daemon key {home.daemon_key_path} (0600)")
    if _write_new(home.config_path, CONFIG_TEMPLATE):
        created.append(f"created {home.config_path}")
    if _write_new(home.grants_path, GRANTS_TEMPLATE):
        created.append(f"created {home.grants_path}")
    return created
