"""An interpreter agent uids cannot reach (a pyenv under a 0700 /root) is found at start."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.daemon.test_daemon_e2e import status
from tests.security.conftest import AttackedDaemon


def test_an_unreachable_interpreter_is_a_warning_or_with_require_a_refusal(attacked: AttackedDaemon) -> None:
    closed = attacked.home.parent / "root-like"
    (closed / "bin").mkdir(parents=True)
    closed.chmod(0o700)
    python = closed / "bin" / "python3"
    shutil.copy("/usr/bin/true", python)
    attacked.write_config(f'[runtime]\npython3 = "{python}"\n\n[isolation]\nrequire = true\n')
    done = subprocess.run([sys.executable, "-m", "covenant", "daemon"], env=attacked.env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert f"{closed} is not searchable by others" in done.stderr and "runtime.python3" in done.stderr

    attacked.write_config(f'[runtime]\npython3 = "{python}"\n')
    attacked.start()
    problems = status(attacked)["isolation_detail"]["problems"]
    assert [p for p in problems if str(python) in p and "runtime.python3" in p]
    assert "agent uids cannot reach what they must run" in attacked.log()
    assert f"isolation  problem: {python}" in attacked.cli("status", check=True).stdout
