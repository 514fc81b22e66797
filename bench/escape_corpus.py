"""The attacker corpus run N times: escape attempts against successes, and processes left behind.

Runs ``tests/security/test_attacker_corpus.py`` N times (each run: a real root
daemon on a temp home and every attack of the corpus), then counts the
processes still running as a uid of the corpus's range after each run. Goals
(issue 12): 0 successful escapes, 0 leaked processes. Needs root.

    .venv/bin/python bench/escape_corpus.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.security.conftest import UID_RANGE  # noqa: E402


def leaked() -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid = int(fields["Uid"].split()[0])
        if UID_RANGE[0] <= uid <= UID_RANGE[1] and not fields["State"].strip().startswith("Z"):
            found.append(int(name))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: the corpus runs agents as other uids")
    attempts = escapes = other_failures = leaks = 0
    start = time.monotonic()
    for i in range(args.runs):
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/security/test_attacker_corpus.py"], cwd=REPO, capture_output=True, text=True)
        passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", done.stdout)) else 0
        failed = re.findall(r"^FAILED (\S+)", done.stdout, re.M)
        # A failure that says an attempt "succeeded" is an escape; anything else (a dispatch that did
        # not run, a timeout) is counted apart.
        escaped = [f for f in failed if "'succeeded': True" in done.stdout]
        attempts += passed + len(failed)
        escapes += len(escaped)
        other_failures += len(failed) - len(escaped)
        left = leaked()
        leaks += len(left)
        print(f"run {i + 1}: {passed} passed, {len(failed)} failed {failed}, leaked {left}", flush=True)
    print()
    print("| runs | attack cases run | escapes (goal 0) | other failures | leaked processes (goal 0) | minutes |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.runs} | {attempts} | {escapes} | {other_failures} | {leaks} | {(time.monotonic() - start) / 60:.1f} |")


if __name__ == "__main__":
    main()
