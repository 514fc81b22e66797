"""The PDEATHSIG helper's bytes are what its assembly listing assembles to (issue 16).

covenant/runtime/pdeathsig.S is the source; scripts/pdeathsig-bytes.sh assembles it with GNU
binutils. Needs `as` and `objcopy` (Debian: binutils); under CI a missing tool fails the test.
"""

from __future__ import annotations

import platform
import subprocess

import pytest

from covenant.runtime.pdeathsig import _code, helper_elf
from tests.conftest import REPO_ROOT, require_tool

SCRIPT = REPO_ROOT / "scripts" / "pdeathsig-bytes.sh"


@pytest.mark.parametrize("pid", [128, 31337, 2**31 - 1])
def test_the_listing_assembles_to_the_bytes_covenant_runs(pid: int) -> None:
    require_tool("as")
    require_tool("objcopy")
    done = subprocess.run([str(SCRIPT), str(pid)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert bytes.fromhex(done.stdout.strip()) == _code(pid)


def test_the_elf_wraps_exactly_that_code() -> None:
    if platform.machine() != "x86_64":
        assert helper_elf(31337) is None  # other architectures: host.py falls back to setpriv
        return
    image = helper_elf(31337)
    assert image is not None and image.endswith(_code(31337)) and len(image) == 64 + 56 + len(_code(31337))
