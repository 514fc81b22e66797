"""The `covenant dispatch` path stays light: none of the heavy libraries get imported.

Each check runs in a fresh interpreter (the test process itself has them all
loaded) and looks at ``sys.modules`` after importing exactly what the CLI
imports for the command.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("trio", "pydantic", "psutil", "yaml", "httpx", "tomlkit", "rich")

_PROBE = """
import json, sys
{imports}
heavy = {heavy!r}
print(json.dumps(sorted({{name.split(".")[0] for name in sys.modules}} & set(heavy))))
"""


def heavy_modules_after(imports: str) -> list[str]:
    code = _PROBE.format(imports=imports, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_dispatch_command_path_imports_no_heavy_library() -> None:
    imports = 'from covenant.cli.main import cli\ncommand = cli.get_command(None, "dispatch")\nassert command.name == "dispatch"'
    assert heavy_modules_after(imports) == []


@pytest.mark.parametrize("module", ["covenant.policy.signing", "covenant.policy.identities", "covenant.client"])
def test_dispatch_dependencies_import_no_heavy_library(module: str) -> None:
    assert heavy_modules_after(f"import {module}") == []


def test_probe_detects_a_heavy_import() -> None:
    """The check itself works: a module that does pull one in is caught."""
    assert "pydantic" in heavy_modules_after("import covenant.config")
