"""The suite's xdist groups hold: tests with one ``xdist_group`` mark run on one worker under ``make test``.

Several modules share a host-wide resource (daemons run as ``nobody``, the fleet's NATS cluster, a
module's one daemon) and rely on their group to run one at a time. pytest 9.2 with pytest-xdist 3.8
ignored every mark without a word; this runs a small suite the way ``make test`` does and checks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GROUPED = """\
import os
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("n", range(8))
def test_grouped(n):
    with open(os.path.join(os.environ["WHERE"], f"grouped-{n}"), "w") as out:
        out.write(os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.parametrize("n", range(8))
def test_free(n):
    pass
"""


def test_tests_of_one_xdist_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "4", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env={"WHERE": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {path.read_text() for path in tmp_path.glob("grouped-*")}
    assert len(list(tmp_path.glob("grouped-*"))) == 8
    assert len(workers) == 1, f"one xdist group ran on {sorted(workers)}: --dist loadgroup ignores the marks"
