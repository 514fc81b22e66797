"""The `covenant dispatch` path stays light: none of the heavy libraries get imported.

Each check runs in a fresh interpreter (the test process itself has them all
loaded) and looks at ``sys.modules`` after importing exactly what the CLI
imports for the command, or at ``-X importtime`` of a real `covenant dispatch`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("trio", "pydantic", "psutil", "yaml", "httpx", "tomlkit", "rich")
# Not heavy for every command, but each costs the click-free dispatch path 5-30 ms of start-up; typing,
# socket (its IntEnums) and httptools (which imports typing) each a tenth or more of its instructions (issue 38).
FAST_PATH_FORBIDDEN = (*HEAVY, "click", "http", "ssl", "email", "h11", "dataclasses", "inspect", "uuid", "tomllib",
                       "datetime", "pathlib", "typing", "socket", "httptools")
# What the daemon loads only once a Rune package, a network listener or an MCP server needs it (idle RSS).
DAEMON_ON_DEMAND = ("yaml", "jsonschema", "regex", "anyio", "hypercorn", "mcp", "httpx", "tomlkit")
COVENANT = Path(sys.executable).parent / "covenant"

_PROBE = """
import json, sys
{imports}
heavy = {heavy!r}
print(json.dumps(sorted({{name.split(".")[0] for name in sys.modules}} & set(heavy))))
"""


def heavy_modules_after(imports: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    code = _PROBE.format(imports=imports, heavy=heavy)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_dispatch_command_path_imports_no_heavy_library() -> None:
    imports = 'from covenant.cli.group import cli\ncommand = cli.get_command(None, "dispatch")\nassert command.name == "dispatch"'
    assert heavy_modules_after(imports) == []


@pytest.mark.parametrize("module", ["covenant.policy.signing", "covenant.policy.identities", "covenant.client"])
def test_dispatch_dependencies_import_no_heavy_library(module: str) -> None:
    assert heavy_modules_after(f"import {module}") == []


@pytest.mark.parametrize("module", ["covenant.cli.main", "covenant.cli.dispatch_args", "covenant.cli.dispatch_run",
                                    "covenant.client"])
def test_fast_path_modules_import_no_click_http_client_or_ssl(module: str) -> None:
    assert heavy_modules_after(f"import {module}", FAST_PATH_FORBIDDEN) == []


def test_the_daemon_loads_rune_listener_and_mcp_libraries_on_demand() -> None:
    assert heavy_modules_after("import covenant.daemon.main", DAEMON_ON_DEMAND) == []


def _env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
            "COVENANT_HOME": str(tmp_path / "home"), "COVENANT_SOCKET": str(tmp_path / "absent.sock"),
            "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "LANG": "C.UTF-8"}


def test_a_real_dispatch_imports_none_of_them(tmp_path: Path) -> None:
    """The whole `covenant dispatch` process (no daemon: it signs, connects, fails with exit 5).

    The identity exists already, as for every dispatch but a user's first (creating a key
    file imports cryptography's serialization package; that is a one-time cost).
    """
    init = subprocess.run([str(COVENANT), "init", "--display", "probe@test"], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert init.returncode == 0, init.stderr
    done = subprocess.run([sys.executable, "-X", "importtime", str(COVENANT), "dispatch", "--agent", "x", "hi"],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 5, done.stderr
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0]
                for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "cryptography" in imported and "_json" in imported  # the probe sees the whole path
    assert sorted(imported & set(FAST_PATH_FORBIDDEN)) == []


def test_dispatch_help_still_comes_from_click(tmp_path: Path) -> None:
    done = subprocess.run([str(COVENANT), "dispatch", "--help"], env=_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: covenant dispatch [OPTIONS] TEXT")
    assert "--priority [low|normal|high]" in done.stdout


def test_probe_detects_a_heavy_import() -> None:
    """The check itself works: a module that does pull one in is caught."""
    assert "pydantic" in heavy_modules_after("import covenant.config")
    assert "click" in heavy_modules_after("import covenant.cli.dispatch_cmd", FAST_PATH_FORBIDDEN)


# What an idle daemon logging to stderr or the journal never needs (issue 38, docs/performance.md "Memory (issue 38)"):
# logging.handlers (and pickle with it) serves a file: log target; difflib the did-you-mean hint of a bad covenant.toml,
# manifest or agent name. Each is imported where it is used, and must still work there.
_IDLE_DAEMON_PROBE = """
import json, sys
import covenant.daemon.main, covenant.cli.daemon_cmd, covenant.logs
from covenant.agent_names import unknown_agent
from covenant.logs import _open_handler
left_out = {"logging.handlers", "pickle", "difflib"}
idle = sorted(set(sys.modules) & left_out)
hint = unknown_agent("ecoh@local", ["echo@local"]).message
handler, _ = _open_handler("file:" + sys.argv[1])
handler.close()
print(json.dumps({"idle": idle, "after": sorted(set(sys.modules) & left_out), "hint": hint,
                  "handler": type(handler).__name__}))
"""


def test_the_idle_daemon_loads_log_file_and_hint_modules_only_when_used(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _IDLE_DAEMON_PROBE, str(tmp_path / "d.log")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["idle"] == []
    assert seen["after"] == ["difflib", "logging.handlers", "pickle"]  # the probe sees them once they are used
    assert "did you mean echo@local?" in seen["hint"] and seen["handler"] == "PrivateLogFile"
    assert (tmp_path / "d.log").stat().st_mode & 0o777 in (0o600, 0o640)
