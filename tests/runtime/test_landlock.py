"""Landlock rulesets built by covenant, enforced on real child processes (no root needed: no_new_privs is enough).

Each child is ``/usr/bin/python3`` running :data:`PROBE` after ``landlock_restrict_self`` in its
``preexec_fn``; it reports, per operation, ``ok`` or the errno name it got.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from covenant.runtime import landlock
from covenant.runtime.landlock import DEVICE, READ_ONLY, READ_WRITE, Rule, build_ruleset, handled_access
from covenant.runtime.tool_files import SYSTEM_DIRS

PYTHON = "/usr/bin/python3"

PROBE = r"""
import errno, json, os, sys

def attempt(op, *args):
    try:
        if op == "read":
            open(args[0], "rb").read(1)
        elif op == "write":
            with open(args[0], "ab") as f:
                f.write(b"x")
        elif op == "create":
            open(args[0], "xb").close()
        elif op == "truncate":
            os.truncate(args[0], 0)
        elif op == "list":
            os.listdir(args[0])
        elif op == "mkdir":
            os.mkdir(args[0])
        elif op == "unlink":
            os.unlink(args[0])
        elif op == "rename":
            os.rename(args[0], args[1])
        elif op == "exec":
            os.spawnv(os.P_WAIT, args[0], [args[0]])
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

print(json.dumps([attempt(*step) for step in json.loads(sys.argv[1])]))
"""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def run_confined(ruleset: int, steps: Sequence[Sequence[str]]) -> list[str]:
    """Run the probe under ``ruleset``; one result per step."""

    def restrict() -> None:
        if _libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            os._exit(70)
        if _libc.syscall(446, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:  # landlock_restrict_self
            os._exit(71)

    done = subprocess.run(
        [PYTHON, "-I", "-c", PROBE, json.dumps(steps)], preexec_fn=restrict, pass_fds=(ruleset,),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def abi() -> int:
    reason = landlock.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return landlock.abi_version()


def system() -> list[Rule]:
    """What the probe's interpreter needs."""
    return [Rule(path, READ_ONLY) for path in SYSTEM_DIRS] + [Rule("/dev/null", DEVICE)]


def test_every_right_each_abi_knows_is_handled() -> None:
    assert handled_access(0) == 0
    assert handled_access(1) == (1 << 13) - 1
    assert handled_access(2) == (1 << 14) - 1  # + REFER
    assert handled_access(3) == handled_access(4) == (1 << 15) - 1  # + TRUNCATE; ABI 4 added network rights only
    assert handled_access(5) == handled_access(7) == (1 << 16) - 1  # + IOCTL_DEV


def test_the_abi_is_asked_once_and_is_new_enough_here(abi: int) -> None:
    assert abi == landlock.abi_version() >= landlock.MIN_ABI
    assert landlock.unavailable_reason() is None


def test_a_child_under_a_ruleset_reads_and_writes_only_what_it_was_given(tmp_path: Path, abi: int) -> None:
    ro, rw, outside = tmp_path / "ro", tmp_path / "rw", tmp_path / "outside"
    for folder in (ro, rw, outside):
        folder.mkdir()
        (folder / "file").write_text("data")
    lone = outside / "lone"
    lone.write_text("one file")
    rules = [*system(), Rule(str(ro), READ_ONLY), Rule(str(rw), READ_WRITE), Rule(str(lone), READ_WRITE),
             Rule(str(tmp_path / "missing"), READ_ONLY)]
    ruleset = build_ruleset(rules, abi)
    try:
        results = run_confined(ruleset, [
            ("read", f"{ro}/file"), ("list", str(ro)), ("exec", "/bin/true"),
            ("write", f"{ro}/file"), ("truncate", f"{ro}/file"), ("create", f"{ro}/new"), ("unlink", f"{ro}/file"),
            ("create", f"{rw}/new"), ("write", f"{rw}/new"), ("truncate", f"{rw}/new"), ("mkdir", f"{rw}/d"),
            ("rename", f"{rw}/new", f"{rw}/d/moved"), ("unlink", f"{rw}/file"),
            ("rename", f"{rw}/d/moved", f"{ro}/moved"),
            ("read", f"{outside}/file"), ("list", str(outside)), ("create", f"{outside}/new"),
            ("read", str(lone)), ("write", str(lone)),
        ])
    finally:
        os.close(ruleset)
    allowed, refused = results[:3] + results[7:13] + results[17:], results[3:7] + results[13:17]
    assert allowed == ["ok"] * len(allowed), results
    assert all(r in ("EACCES", "EXDEV", "EPERM") for r in refused), results  # a refused rename is EXDEV
    assert (ro / "file").read_text() == "data" and not (ro / "moved").exists() and not (outside / "new").exists()


def test_required_paths_must_exist_and_are_never_reached_through_a_symlink(tmp_path: Path, abi: int) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(FileNotFoundError):
        build_ruleset([Rule(str(tmp_path / "gone"), READ_WRITE, follow=False, required=True)], abi)
    with pytest.raises(OSError) as refused:
        build_ruleset([Rule(str(link), READ_WRITE, follow=False, required=True)], abi)
    assert refused.value.errno == errno.ELOOP
    # Not required: skipped, so the link's target stays closed.
    ruleset = build_ruleset([*system(), Rule(str(link), READ_WRITE, follow=False)], abi)
    try:
        assert run_confined(ruleset, [("create", f"{real}/x")]) == ["EACCES"]
    finally:
        os.close(ruleset)
