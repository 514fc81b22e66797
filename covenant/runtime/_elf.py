"""Tiny static x86-64 helpers: assemble, wrap in an ELF image, install in a sealed memfd.

covenant's exec helpers (:mod:`~covenant.runtime.pdeathsig`,
:mod:`~covenant.runtime.uidkill`) are a few dozen instructions making raw
system calls between fork and exec, where CPython cannot run code without
``preexec_fn`` (a full fork, unsafe with threads). They need no loader and
no libc, so an exec costs ~0.1 ms. Each lives in a sealed memfd of the
covenant process (nothing on disk, nobody can modify it) and is executed as
``/proc/<covenant pid>/fd/<n>``.
"""

from __future__ import annotations

import fcntl
import os
import platform
import struct
from collections.abc import Sequence

__all__ = [
    "ABORT",
    "JNE",
    "JE",
    "CREDENTIALS_LEN",
    "assemble",
    "switch_credentials",
    "elf_image",
    "supported",
    "install_sealed",
]

_BASE = 0x400000
_HEADERS = 64 + 56
_MFD_EXEC = 0x0010
"""Linux >= 6.3: ask for an executable memfd explicitly (older kernels reject the flag)."""

ABORT = b"<abort>"
"""Marks where the abort code starts in :func:`assemble`'s pieces (exactly once)."""
JNE = (0x85,)
"""A piece: ``jne abort`` (rel32)."""
JE = (0x84,)
"""A piece: ``je abort`` (rel32)."""

_JUMP_LEN = 6


def assemble(pieces: Sequence[bytes | tuple[int]]) -> bytes:
    """Concatenate machine code; each :data:`JNE`/:data:`JE` becomes a rel32 jump to :data:`ABORT`."""
    at = 0
    abort_at = None
    for piece in pieces:
        if piece is ABORT or piece == ABORT:
            abort_at = at
        else:
            at += _JUMP_LEN if isinstance(piece, tuple) else len(piece)
    if abort_at is None:
        raise ValueError("assemble: no ABORT label among the pieces")
    out = bytearray()
    for piece in pieces:
        if piece == ABORT:
            continue
        if isinstance(piece, tuple):
            rel = abort_at - (len(out) + _JUMP_LEN)
            out += bytes([0x0F, piece[0]]) + struct.pack("<i", rel)
        else:
            out += piece
    return bytes(out)


CREDENTIALS_LEN = 8
"""Bytes :func:`switch_credentials` reads from stdin: uid then gid, each a little-endian u32."""


def switch_credentials() -> list[bytes | tuple[int]]:
    """Code that takes the credentials from stdin and becomes them, for good.

    Reads exactly :data:`CREDENTIALS_LEN` bytes from fd 0 (the supervisor
    wrote them into the pipe before the spawn); a short read, uid 0 or gid
    0 aborts. Then ``setgroups(0, NULL)`` (no supplementary groups),
    ``setgid``, ``setuid`` (as root these set real, effective and saved ids,
    and the capabilities go), and ``PR_SET_NO_NEW_PRIVS`` so no set-uid
    program can give them back. Any failing call aborts: fail closed. The
    two ids are kept just below the stack pointer (nothing else uses it).
    """
    check = b"\x85\xc0"  # test %eax, %eax
    syscall = b"\x0f\x05"
    return [
        b"\x31\xc0",  # xor %eax, %eax            read
        b"\x31\xff",  # xor %edi, %edi            fd 0
        b"\x48\x8d\x74\x24\xf0",  # lea -16(%rsp), %rsi
        b"\xba\x08\x00\x00\x00",  # mov $8, %edx
        syscall,
        b"\x83\xf8\x08",  # cmp $8, %eax
        JNE,
        b"\x8b\x7c\x24\xf4",  # mov -12(%rsp), %edi    gid
        b"\x85\xff",  # test %edi, %edi
        JE,
        b"\x8b\x7c\x24\xf0",  # mov -16(%rsp), %edi    uid
        b"\x85\xff",  # test %edi, %edi
        JE,
        b"\x31\xff",  # xor %edi, %edi
        b"\x31\xf6",  # xor %esi, %esi
        b"\xb8\x74\x00\x00\x00",  # mov $116, %eax        setgroups(0, NULL)
        syscall,
        check,
        JNE,
        b"\x8b\x7c\x24\xf4",  # mov -12(%rsp), %edi
        b"\xb8\x6a\x00\x00\x00",  # mov $106, %eax        setgid
        syscall,
        check,
        JNE,
        b"\x8b\x7c\x24\xf0",  # mov -16(%rsp), %edi
        b"\xb8\x69\x00\x00\x00",  # mov $105, %eax        setuid
        syscall,
        check,
        JNE,
        b"\xbf\x26\x00\x00\x00",  # mov $38, %edi         PR_SET_NO_NEW_PRIVS
        b"\xbe\x01\x00\x00\x00",  # mov $1, %esi
        b"\x31\xd2",  # xor %edx, %edx
        b"\x45\x31\xd2",  # xor %r10d, %r10d
        b"\x45\x31\xc0",  # xor %r8d, %r8d
        b"\xb8\x9d\x00\x00\x00",  # mov $157, %eax        prctl
        syscall,
        check,
        JNE,
    ]


def supported() -> bool:
    """Can this machine run the hand-assembled helpers (x86-64 only)?"""
    return platform.machine() in ("x86_64", "AMD64")


def elf_image(code: bytes) -> bytes:
    """``code`` as a complete static ELF executable: one R+X segment, entry right after the headers."""
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


def install_sealed(name: str, image: bytes) -> str | None:
    """Put ``image`` in a sealed, close-on-exec memfd of this process; return its exec path, or None.

    The descriptor stays open for the life of the process. The caller must
    check that the path actually runs: ``vm.memfd_noexec``, a non-dumpable
    process or a restricted /proc can forbid it.
    """
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    try:
        try:
            fd = os.memfd_create(name, flags | _MFD_EXEC)
        except OSError:
            fd = os.memfd_create(name, flags)
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
