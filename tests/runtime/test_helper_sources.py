"""covenant's hand-assembled exec helpers are what their assembly listings assemble to (issue 16).

The listings are covenant/runtime/asm/*.S; scripts/helper-bytes.sh assembles one with GNU binutils
(`as`, `objcopy`). Under CI a missing tool fails the test (tests/conftest.py require_tool).
"""

from __future__ import annotations

import subprocess

import pytest

from covenant.runtime import _elf, pdeathsig, uidkill
from tests.conftest import REPO_ROOT, require_tool

SCRIPT = REPO_ROOT / "scripts" / "helper-bytes.sh"


def _assembled(*args: str) -> bytes:
    require_tool("as")
    require_tool("objcopy")
    done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return bytes.fromhex(done.stdout.strip())


@pytest.mark.parametrize("pid", [128, 31337, 2**31 - 1])
@pytest.mark.parametrize("credentials", [False, True])
def test_the_pdeathsig_listing_assembles_to_the_bytes_covenant_runs(pid: int, credentials: bool) -> None:
    args = ("pdeathsig", str(pid), *(("CREDENTIALS",) if credentials else ()))
    assert _assembled(*args) == pdeathsig._code(pid, credentials)


def test_the_uidkill_listing_assembles_to_the_bytes_covenant_runs() -> None:
    assert _assembled("uidkill") == uidkill._code()


def test_the_elf_wraps_exactly_that_code() -> None:
    image = pdeathsig.helper_elf(31337)
    if not _elf.supported():
        assert image is None  # other architectures: host.py falls back to setpriv (no gate)
        return
    code = pdeathsig._code(31337, False)
    assert image is not None and image.endswith(code) and len(image) == 64 + 56 + len(code)
