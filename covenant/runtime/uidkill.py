"""Kill every process of one uid, whatever it did to hide.

A hostile agent can leave its process group and session (``setsid``), fork
twice so its parent is gone, empty its environment (no intent marker) and
make itself non-dumpable (its ``/proc/<pid>`` then belongs to root). What it
cannot change is its uid. So the sweep is ``kill(-1, SIGKILL)`` *made as that
uid*: the kernel signals every process the caller may signal — every process
of the uid, except the caller — in one pass over its task list under
``tasklist_lock``. A fork racing the pass either joins the list before it
(and is killed) or finds SIGKILL already pending on its parent (and fails).
No /proc scan, so nothing to race.

The caller is :func:`helper_elf`, a static x86-64 program built like the
PDEATHSIG helper (:mod:`covenant.runtime._elf`): it reads uid and gid from
stdin, drops to them, calls ``kill(-1, SIGKILL)`` twice and exits 0 (1 when
it could not become that uid). Elsewhere ``setpriv --reuid --regid
--clear-groups kill -KILL -1`` does the same with two dynamically linked
programs. Never run it for uid 0: the helper refuses.

Its source is ``covenant/runtime/asm/uidkill.S``; ``scripts/helper-bytes.sh
uidkill`` assembles it and ``tests/runtime/test_helper_sources.py`` checks
the bytes equal :func:`_code`.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading

from covenant.runtime import _elf, host

__all__ = ["helper_elf", "kill_uid", "available"]

_lock = threading.Lock()


def _code() -> bytes:
    syscall = b"\x0f\x05"
    kill_all = [
        b"\xbf\xff\xff\xff\xff",  # mov $-1, %edi
        b"\xbe\x09\x00\x00\x00",  # mov $9, %esi
        b"\xb8\x3e\x00\x00\x00",  # mov $62, %eax   kill(-1, SIGKILL)
        syscall,
    ]
    pieces: list[_elf.Piece] = [
        *_elf.read_credentials(),
        *_elf.become_credentials(),
        *kill_all,
        *kill_all,
        b"\x31\xff",  # xor %edi, %edi
        b"\xb8\xe7\x00\x00\x00",  # mov $231, %eax  exit_group(0)
        syscall,
        _elf.ABORT,
        b"\xbf\x01\x00\x00\x00",  # mov $1, %edi
        b"\xb8\xe7\x00\x00\x00",  # mov $231, %eax  exit_group(1)
        syscall,
    ]
    return _elf.assemble(pieces)


def helper_elf() -> bytes | None:
    """The kill helper as an ELF executable for this machine, or None if unsupported."""
    return _elf.elf_image(_code()) if _elf.supported() else None


@functools.cache
def _helper(pid: int) -> str | None:
    image = helper_elf()
    return _elf.install_sealed("covenant-uidkill", image) if image is not None else None


@functools.cache
def _fallback() -> tuple[str, ...] | None:
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    kill = shutil.which("kill", path="/usr/bin:/bin")
    if setpriv is None or kill is None:
        return None
    return (setpriv, "--clear-groups", "--no-new-privs", "--reuid", "{uid}", "--regid", "{gid}", "--", kill, "-KILL", "-1")


def available() -> bool:
    """Can this process kill by uid here (may switch uid, and a helper or setpriv)? (cached helper)"""
    return host.can_switch_uid() and (_helper(os.getpid()) is not None or _fallback() is not None)


def kill_uid(uid: int, gid: int) -> bool:
    """SIGKILL every process whose real or saved uid is ``uid`` (blocking, ~0.2 ms).

    Returns False when it could not be done (not root, no helper). The
    killed processes still have to be reaped by their parents (covenant
    reaps the orphans it adopted).
    """
    if uid <= 0 or gid <= 0:
        raise ValueError(f"kill_uid refuses uid {uid} / gid {gid}: never root")
    with _lock:  # one memfd per process, made once
        helper = _helper(os.getpid())
    if helper is not None:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            os.write(write_end, _elf.credentials_block(uid, gid))
            os.close(write_end)
            write_end = -1
            done = subprocess.run([helper], stdin=read_end, env={}, close_fds=True, check=False)
        except OSError:
            return False
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        return done.returncode == 0
    template = _fallback()
    if template is None:
        return False
    argv = [part.format(uid=uid, gid=gid) for part in template]
    try:
        done = subprocess.run(argv, env={}, capture_output=True, check=False)
    except OSError:
        return False
    # kill(1) exits 1 when the uid had no process left to signal: that is success too.
    return done.returncode in (0, 1)
