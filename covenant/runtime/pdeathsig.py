"""A tiny static exec helper: PR_SET_PDEATHSIG=SIGKILL, wait at a gate, exec the agent.

The parent-death signal must be set by the child itself between fork and
exec. CPython cannot run code there without ``preexec_fn`` (which forces a
full fork and is unsafe with threads), so the agent is started through a
wrapper. ``setpriv --pdeathsig KILL`` works but is a dynamically linked
program: ~1.2 ms per spawn on the reference box. This helper is ~120 bytes of
x86-64 machine code in a hand-built ELF (:mod:`covenant.runtime._elf`), no
loader and no libc: ~0.1 ms.

The credentialed variant (a daemon running as root, docs/security.md) also
becomes the agent's uid and gid: it reads them from its stdin (a block the
launcher wrote into the pipe before the spawn, :func:`~covenant.runtime._elf.
read_credentials`, which also enters the agent uid's mount namespace), waits
at the gate *as root* (so the supervisor may set rlimits and nice without
CAP_SYS_RESOURCE), then drops to the uid (:func:`~covenant.runtime._elf.
become_credentials`: no supplementary groups, no new privileges) and only
then arms PR_SET_PDEATHSIG: the kernel clears the parent-death signal
whenever the credentials change. CPython's own ``Popen(user=...)`` would
switch too, but only on its slow fork path (no vfork once uid or gid are
given).

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

The source is ``covenant/runtime/asm/pdeathsig.S`` (GNU as, commented line
by line; the credentialed variant includes ``read_credentials.S`` and
``become_credentials.S``).
``scripts/helper-bytes.sh pdeathsig PID [CREDENTIALS]`` assembles it with
binutils and prints the bytes; ``tests/runtime/test_helper_sources.py``
checks they equal :func:`_code`. Change the listing and the pieces together.
"""

from __future__ import annotations

import os
import struct

from covenant.runtime import _elf

__all__ = ["GATE_BYTE", "helper_elf", "install_helper"]

GATE_BYTE = b"\x01"
"""What the supervisor writes to let a gated helper exec the agent (any single byte would do)."""


def _code(parent_pid: int, credentials: bool) -> bytes:
    syscall = b"\x0f\x05"
    gate = [
        b"\x31\xc0",  # xor %eax, %eax                        read
        b"\x31\xff",  # xor %edi, %edi                        fd 0
        b"\x48\x8d\x74\x24\xf8",  # lea -8(%rsp), %rsi
        b"\xba\x01\x00\x00\x00",  # mov $1, %edx             one byte: the gate
        syscall,
        b"\x83\xf8\x01",  # cmp $1, %eax
        _elf.JNE,  # end of file: the start was withdrawn
    ]
    arm = [
        b"\xbf\x01\x00\x00\x00",  # mov $1, %edi            PR_SET_PDEATHSIG
        b"\xbe\x09\x00\x00\x00",  # mov $9, %esi            SIGKILL
        b"\x31\xd2",  # xor %edx, %edx
        b"\xb8\x9d\x00\x00\x00",  # mov $157, %eax          prctl
        syscall,
        b"\xb8\x6e\x00\x00\x00",  # mov $110, %eax          getppid
        syscall,
        b"\x3d" + struct.pack("<I", parent_pid),  # cmp $pid, %eax
        _elf.JNE,
    ]
    if credentials:
        # Still root at the gate (the supervisor's prlimit needs that), the agent's uid after it;
        # PDEATHSIG is armed last because a credential change clears it.
        pieces = [*_elf.read_credentials(), *gate, *_elf.become_credentials(), *arm]
    else:
        pieces = [*arm, *gate]
    pieces += [
        b"\x48\x8b\x0c\x24",  # mov (%rsp), %rcx                argc
        b"\x48\x8d\x74\x24\x10",  # lea 16(%rsp), %rsi       argv + 1
        b"\x48\x8b\x3e",  # mov (%rsi), %rdi                     path = argv[1]
        b"\x48\x8d\x54\xcc\x10",  # lea 16(%rsp,%rcx,8), %rdx  envp
        b"\xb8\x3b\x00\x00\x00",  # mov $59, %eax            execve
        syscall,
        b"\xbf\x7f\x00\x00\x00",  # mov $127, %edi           exec failed: exit 127
        b"\xb8\xe7\x00\x00\x00",  # mov $231, %eax           exit_group
        syscall,
        _elf.ABORT,
        b"\xb8\x27\x00\x00\x00",  # mov $39, %eax            getpid
        syscall,
        b"\x89\xc7",  # mov %eax, %edi
        b"\xbe\x09\x00\x00\x00",  # mov $9, %esi
        b"\xb8\x3e\x00\x00\x00",  # mov $62, %eax            kill(self, SIGKILL)
        syscall,
    ]
    return _elf.assemble(pieces)


def helper_elf(parent_pid: int, *, credentials: bool = False) -> bytes | None:
    """The helper as a complete ELF executable for this machine, or None if unsupported.

    With ``credentials`` it first reads uid and gid (two little-endian u32)
    from stdin and becomes them; see the module docstring.
    """
    if not _elf.supported() or not 0 < parent_pid < 2**31:
        return None
    return _elf.elf_image(_code(parent_pid, credentials))


def install_helper(*, credentials: bool = False) -> str | None:
    """Put the helper in a sealed memfd of this process; return its exec path, or None.

    The caller must check that the path actually runs (see
    :func:`covenant.runtime._elf.install_sealed`).
    """
    image = helper_elf(os.getpid(), credentials=credentials)
    if image is None:
        return None
    name = "covenant-pdeathsig-uid" if credentials else "covenant-pdeathsig"
    return _elf.install_sealed(name, image)
