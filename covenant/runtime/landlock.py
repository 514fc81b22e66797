"""Landlock, the kernel's unprivileged file-access sandbox: its ABI and rulesets, through ctypes syscalls.

A ruleset is a file descriptor naming, for each allowed hierarchy (a directory and everything
beneath it, or one file), the access rights granted there; every right the ruleset *handles* is
denied everywhere else. covenant builds one in the daemon and its exec helper enforces it on a
tool process after the switch to the agent's uid (``landlock_restrict_self``,
:func:`covenant.runtime._elf.become_credentials`), so the tool's program starts confined and so
does every process it starts. A rule names an inode, not a path: it is opened here (``O_PATH``)
and the rule follows that directory wherever it is reached from (a bind mount too).

The syscalls are blocking in the sense that matters here (a path lookup per rule): call
:func:`build_ruleset` off the event loop. Docs: docs/security.md, "Tool files".
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "DEVICE",
    "MIN_ABI",
    "READ_ONLY",
    "READ_WRITE",
    "Rule",
    "abi_version",
    "build_ruleset",
    "handled_access",
    "unavailable_reason",
]

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
_ABI_1 = (1 << 13) - 1
"""ABI 1: execute, write/read file, read dir, remove dir/file, make char/dir/reg/sock/fifo/block/sym."""
REFER = 1 << 13
"""ABI 2: link or rename a file into another directory."""
TRUNCATE = 1 << 14
"""ABI 3: truncate(2), ftruncate(2), open with O_TRUNC."""
IOCTL_DEV = 1 << 15
"""ABI 5: ioctl(2) on a character or block device."""
_RIGHTS_BY_ABI = ((1, _ABI_1), (2, REFER), (3, TRUNCATE), (5, IOCTL_DEV))
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The rights a rule on a file (not a directory) may carry; the others are the directory's."""

READ_ONLY = EXECUTE | READ_FILE | READ_DIR
"""Run and read files, list directories."""
READ_WRITE = (1 << 64) - 1
"""Everything the ruleset handles (masked per ABI): create, write, remove, rename, truncate, run."""
DEVICE = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV
"""``/dev/null`` and friends: read, write (``> /dev/null`` opens with O_TRUNC) and ioctl."""

MIN_ABI = 3
"""Below ABI 3 Landlock cannot refuse truncate(2): a tool could empty a file it may only read."""


@dataclass(frozen=True)
class Rule:
    """``access`` granted beneath ``path`` (a directory) or on it (a file)."""

    path: str
    access: int
    follow: bool = True
    """Follow a symlink at ``path`` (system files, e.g. ``/etc/resolv.conf``); False refuses one (paths
    an agent's uid could have made: a symlink there must never widen what the tool sees)."""
    required: bool = False
    """A missing path is an error; otherwise it is skipped (``/lib32`` on a host without it)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


@functools.cache
def _probe() -> tuple[int, str | None]:
    result = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if result >= 0:
        return int(result), None
    code = ctypes.get_errno()
    if code == errno.ENOSYS:
        return 0, "this kernel has no Landlock (Linux 5.13 or newer built with CONFIG_SECURITY_LANDLOCK)"
    if code == errno.EOPNOTSUPP:
        return 0, "Landlock is built into this kernel but not enabled (add landlock to the lsm= boot parameter)"
    if code == errno.EPERM:
        return 0, ("a seccomp filter refuses the Landlock calls (under systemd, SystemCallFilter= must allow "
                   "landlock_create_ruleset, landlock_add_rule and landlock_restrict_self)")
    return 0, f"Landlock cannot be used here: landlock_create_ruleset: {os.strerror(code)}"


def abi_version() -> int:
    """The Landlock ABI this kernel offers (0: none); asked once per process."""
    return _probe()[0]


def unavailable_reason() -> str | None:
    """Why Landlock cannot confine tools on this kernel, or None (ABI :data:`MIN_ABI` or newer)."""
    abi, reason = _probe()
    if reason is None and abi < MIN_ABI:
        reason = (f"this kernel offers Landlock ABI {abi}, which cannot refuse truncating a file; "
                  f"ABI {MIN_ABI} (Linux 6.2) or newer is needed")
    return reason


def handled_access(abi: int) -> int:
    """Every file-system right Landlock ABI ``abi`` knows: all of them are handled, hence denied unless granted."""
    handled = 0
    for since, rights in _RIGHTS_BY_ABI:
        if abi >= since:
            handled |= rights
    return handled


def _add_rule(ruleset: int, rule: Rule, handled: int) -> None:
    flags = os.O_PATH | os.O_CLOEXEC | (0 if rule.follow else os.O_NOFOLLOW)
    try:
        fd = os.open(rule.path, flags)
    except (FileNotFoundError, NotADirectoryError):
        if rule.required:
            raise
        return
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISLNK(mode):
            if rule.required:
                raise OSError(errno.ELOOP, f"{rule.path} is a symlink: it is not followed for a tool's files")
            return
        allowed = rule.access & handled
        if not stat.S_ISDIR(mode):
            allowed &= _FILE_RIGHTS
        if not allowed:
            return
        attr = _PathBeneathAttr(allowed, fd)
        _check(
            _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(attr),
                     ctypes.c_uint32(0)),
            f"landlock_add_rule {rule.path}",
        )
    finally:
        os.close(fd)


def build_ruleset(rules: Iterable[Rule], abi: int) -> int:
    """A new ruleset fd (close-on-exec, the caller's to close) handling every right of ``abi``, with ``rules``.

    Blocking. Raises OSError for a required path that is missing or a symlink, and for a rule the
    kernel refuses; the ruleset is closed then.
    """
    handled = handled_access(abi)
    attr = _RulesetAttr(handled)
    ruleset = _check(
        _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0)),
        "landlock_create_ruleset",
    )
    try:
        for rule in rules:
            _add_rule(ruleset, rule, handled)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset
