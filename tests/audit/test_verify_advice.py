"""A failed `covenant audit verify` says what to do next, on stderr, after the FAILED line (issue 16)."""

from __future__ import annotations

import os
import subprocess
import sys

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.home import Home
from tests.audit.conftest import read_lines, segment, write_events_sync, write_lines


def test_a_changed_record_fails_with_the_next_steps(home_with_key: tuple[Home, Ed25519PrivateKey]) -> None:
    home, key = home_with_key
    write_events_sync(home.audit_dir, key, sequential=3)
    lines = read_lines(segment(home.audit_dir))
    write_lines(segment(home.audit_dir), [line.replace(b'"outcome":"ok"', b'"outcome":"no"', 1) if b'"i1"' in line else line
                                          for line in lines])
    done = subprocess.run([sys.executable, "-m", "covenant", "audit", "verify"], env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stdout.startswith("FAILED: audit-000000.jsonl, seq ")
    assert "Keep a copy of the audit folder as evidence" in done.stderr and "--witness FILE" in done.stderr
