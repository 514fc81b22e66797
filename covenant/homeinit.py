"""``covenant init``: create a home with safe modes. Idempotent; never overwrites a key.

The modes (design/rune-host.md §8, docs/security.md) let agent uids reach what
they must run and nothing else:

============================  =====  ==============================================
path                          mode   why
============================  =====  ==============================================
home                          0711   traversable, not listable
agents/                       0755   agents read their package, never write it
identity/, audit/             0700   the daemon's key and log
identity/daemon.key           0600   checked at every start (a wider key is refused)
covenant.toml, grants.toml,   0600   kept by every writer (tomlkit rewrites)
identities.toml
state/, state/workspaces/     0711   agents traverse to their own dir only
state/snapshots/              0711   agents read their package's snapshot, as agents/
state/* (dispatches, ...)     0700
run/                          0750   the control socket: daemon and its group only
============================  =====  ==============================================

``init_home`` sets them on what this uid owns (every daemon start runs it);
:func:`check_home_modes` refuses to start when one is still too wide.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from covenant.errors import ConfigError
from covenant.home import Home
from covenant.keys import create_key_file, ensure_private_dir

__all__ = ["init_home", "check_home_modes", "mode_problems", "home_modes", "CONFIG_TEMPLATE", "GRANTS_TEMPLATE"]

CONFIG_TEMPLATE = """\
# covenant daemon configuration. Every key is optional; the values shown are the defaults.
# Reference: docs/configuration.md

# agents_dir = "agents"          # manifests; relative paths are inside this home
# socket = "run/covenant.sock"   # control socket (env COVENANT_SOCKET overrides)
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

[isolation]                                # when the daemon runs as root (docs/security.md)
# uid_range = [61184, 65519]               # one uid per agent, kept in state/isolation/uids.json
# user = "covenant-agent"                  # or one fixed account for every agent
# require = false                          # true: refuse to start unless agents run as other uids
# max_processes = 256                      # RLIMIT_NPROC of each agent uid
# tmp_inodes = 65536                       # most inodes of each agent uid's private /tmp and /dev/shm
"""

GRANTS_TEMPLATE = """\
# Capability grants, each signed by this home's daemon key.
# Edit with `covenant grant` / `covenant revoke`; a hand-edited entry does not verify and is ignored.
"""


def home_modes(home: Home) -> list[tuple[Path, int]]:
    """Each path of the home with the mode it must have (never wider)."""
    return [
        (home.root, 0o711),
        (home.agents_dir, 0o755),
        (home.identity_dir, 0o700),
        (home.daemon_key_path, 0o600),
        (home.audit_dir, 0o700),
        (home.state_dir, 0o711),
        (home.workspaces_dir, 0o711),
        (home.dispatches_dir, 0o700),
        (home.run_dir, 0o750),
        (home.config_path, 0o600),
        (home.grants_path, 0o600),
        (home.known_identities_path, 0o600),
    ]


def _mkdir(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    _narrow(path, mode)


def _narrow(path: Path, mode: int) -> None:
    """chmod ``path`` to ``mode`` when we own it (a symlink's target: covenant.toml may link to /etc)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def _write_new(path: Path, text: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return True


def init_home(home: Home) -> list[str]:
    """Create what is missing in ``home`` and set the modes; return a line per thing created."""
    created: list[str] = []
    if not home.root.exists():
        created.append(f"created {home.root}")
    _mkdir(home.root, 0o711)
    for path, mode in (
        (home.agents_dir, 0o755),
        (home.audit_dir, 0o700),
        (home.state_dir, 0o711),
        (home.workspaces_dir, 0o711),
        (home.dispatches_dir, 0o700),
        (home.run_dir, 0o750),
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
    for path, mode in home_modes(home):
        _narrow(path, mode)
    return created


_ADVISORY = {"covenant.toml"}
"""Holds no secret (provider keys are named, never written): too wide is a warning, not a refusal.
Under the systemd unit it is a link to /etc/covenant/covenant.toml, which root owns."""


def mode_problems(home: Home) -> list[tuple[str, bool]]:
    """(message with the fix, advisory) for each path of the home whose mode is wider than it must be."""
    problems = []
    for path, mode in home_modes(home):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        extra = stat.S_IMODE(st.st_mode) & ~mode & 0o777
        if not extra:
            continue
        message = (
            f"{path}: mode {stat.S_IMODE(st.st_mode):04o} gives others access they must not have "
            f"(agents run as other uids); fix: chmod {mode:o} {path}"
        )
        problems.append((message, path.name in _ADVISORY))
    return problems


def check_home_modes(home: Home) -> list[str]:
    """Refuse (ConfigError, naming every such path) when a path of the home grants more than its mode.

    Run at daemon start after :func:`init_home`, which narrows what covenant
    owns: what is left is owned by someone else (a key copied in by root).
    Returns the warnings for paths where a wider mode is only advisory.
    """
    problems = mode_problems(home)
    refused = [message for message, advisory in problems if not advisory]
    if refused:
        raise ConfigError("\n".join(refused), path=refused[0].partition(":")[0])
    return [message for message, _ in problems]
