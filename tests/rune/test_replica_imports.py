"""The replica stays lean: no daemon code, no pydantic, httpx, hypercorn, yaml or psutil in its process."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_replica_imports_nothing_heavy() -> None:
    code = "import sys, json, covenant.rune.host; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                                           check=True).stdout))
    packages = {"pydantic", "httpx", "hypercorn", "yaml", "psutil", "click", "cryptography"}
    layers = ("covenant.daemon", "covenant.models", "covenant.tools", "covenant.manifest", "covenant.policy")
    heavy = sorted(m for m in loaded if m.split(".")[0] in packages or m.startswith(layers))
    assert heavy == []
    assert "covenant.rune.loop" in loaded and "trio" in loaded and "h11" in loaded  # the check sees imports
