"""A tiny static exec helper: PR_SET_PDEATHSIG=SIGKILL, wait at a gate, exec the agent.

The parent-death signal must be set by the child itself between fork and
exec. CPython cannot run code there without ``preexec_fn`` (which forces a
full fork and is unsafe with threads), so the agent is started through a
wrapper. ``setpriv --pdeathsig KILL`` works but is a dynamically linked
program: ~1.2 ms per spawn on the reference box. This helper is 109 bytes of
x86-64 machine code in a hand-built ELF, no loader and no libc: ~0.1 ms.

The gate: before exec the helper reads exactly one byte from its stdin (the
agent's stdin pipe). The supervisor writes that byte, followed by the
intent line, only once the agent is allowed to start: its rlimits and nice
value are set and ``agent.spawned`` is durable in the audit log. So the
spawn (fork, exec of the helper) overlaps with that work and the agent still
runs no instruction of its own before it. End of file instead of the byte
means the start was withdrawn: the helper kills itself.

It lives in a sealed memfd of the covenant process (nothing on disk, nobody
can modify it) and is executed as ``/proc/<covenant pid>/fd/<n>``. The
covenant pid is baked into the code: if the helper's parent is not covenant
any more when the signal is armed (covenant died during the spawn), it kills
itself instead of running the agent. Other architectures fall back to setpriv
(no gate).

The source is ``covenant/runtime/pdeathsig.S`` (GNU as, commented line by
line); ``scripts/pdeathsig-bytes.sh PID`` assembles it with binutils and
prints the bytes, and ``tests/runtime/test_pdeathsig_source.py`` checks they
equal :func:`_code` here. Change the listing and this function together.
"""

from __future__ import annotations

import fcntl
import os
import platform
import struct

__all__ = ["GATE_BYTE", "helper_elf", "install_helper"]

GATE_BYTE = b"\x01"
"""What the supervisor writes to let a gated helper exec the agent (any single byte would do)."""

_BASE = 0x400000
_HEADERS = 64 + 56
_MFD_EXEC = 0x0010
"""Linux >= 6.3: ask for an executable memfd explicitly (older kernels reject the flag)."""


def _code(parent_pid: int) -> bytes:
    prologue = (
        b"\xbf\x01\x00\x00\x00"  # mov $1, %edi
        b"\xbe\x09\x00\x00\x00"  # mov $9, %esi
        b"\xb8\x9d\x00\x00\x00"  # mov $157, %eax
        b"\x0f\x05"  # syscall
        b"\xb8\x6e\x00\x00\x00"  # mov $110, %eax
        b"\x0f\x05"  # syscall
        b"\x3d" + struct.pack("<I", parent_pid)  # cmp $pid, %eax
    )
    gate = (
        b"\x31\xc0"  # xor %eax, %eax
        b"\x31\xff"  # xor %edi, %edi
        b"\x48\x8d\x74\x24\xf8"  # lea -8(%rsp), %rsi
        b"\xba\x01\x00\x00\x00"  # mov $1, %edx
        b"\x0f\x05"  # syscall
        b"\x83\xf8\x01"  # cmp $1, %eax
    )
    exec_part = (
        b"\x48\x8b\x0c\x24"  # mov (%rsp), %rcx
        b"\x48\x8d\x74\x24\x10"  # lea 16(%rsp), %rsi
        b"\x48\x8b\x3e"  # mov (%rsi), %rdi
        b"\x48\x8d\x54\xcc\x10"  # lea 16(%rsp,%rcx,8), %rdx
        b"\xb8\x3b\x00\x00\x00"  # mov $59, %eax
        b"\x0f\x05"  # syscall
        b"\xbf\x7f\x00\x00\x00"  # mov $127, %edi
        b"\xb8\xe7\x00\x00\x00"  # mov $231, %eax
        b"\x0f\x05"  # syscall
    )
    abort = (
        b"\xb8\x27\x00\x00\x00"  # mov $39, %eax
        b"\x0f\x05"  # syscall
        b"\x89\xc7"  # mov %eax, %edi
        b"\xbe\x09\x00\x00\x00"  # mov $9, %esi
        b"\xb8\x3e\x00\x00\x00"  # mov $62, %eax
        b"\x0f\x05"  # syscall
    )
    gate_closed = b"\x75" + bytes([len(exec_part)])  # jne abort (rel8)
    gated = gate + gate_closed + exec_part
    orphaned = b"\x75" + bytes([len(gated)])  # jne abort (rel8)
    return prologue + orphaned + gated + abort


def helper_elf(parent_pid: int) -> bytes | None:
    """The helper as a complete ELF executable for this machine, or None if unsupported."""
    if platform.machine() not in ("x86_64", "AMD64") or not 0 < parent_pid < 2**31:
        return None
    code = _code(parent_pid)
    size = _HEADERS + len(code)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little endian, version 1, SysV
    ehdr = ident + struct.pack(
        "<HHIQQQIHHHHHH",
        2,  # ET_EXEC
        62,  # EM_X86_64
        1,  # EV_CURRENT
        _BASE + _HEADERS,  # entry point: right after the headers
        64,  # program headers follow the ELF header
        0,  # no section headers
        0,  # flags
        64,  # ELF header size
        56,  # program header size
        1,  # one program header
        0,
        0,
        0,
    )
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, _BASE, _BASE, size, size, 0x1000)  # PT_LOAD, R+X, whole file
    return ehdr + phdr + code


def install_helper() -> str | None:
    """Put the helper in a sealed memfd of this process; return its exec path, or None.

    The descriptor stays open (close-on-exec) for the life of the process.
    The caller must check that the path actually runs: ``vm.memfd_noexec``,
    a non-dumpable process or a restricted /proc can forbid it.
    """
    image = helper_elf(os.getpid())
    if image is None:
        return None
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    try:
        try:
            fd = os.memfd_create("covenant-pdeathsig", flags | _MFD_EXEC)
        except OSError:
            fd = os.memfd_create("covenant-pdeathsig", flags)
    except (OSError, AttributeError):
        return None
    try:
        os.write(fd, image)
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except OSError:
        os.close(fd)
        return None
    return f"/proc/{os.getpid()}/fd/{fd}"
