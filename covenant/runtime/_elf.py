"""Tiny static x86-64 helpers: assemble, wrap in an ELF image, install in a sealed memfd.

covenant's exec helpers (:mod:`~covenant.runtime.pdeathsig`,
:mod:`~covenant.runtime.uidkill`) are a few dozen instructions making raw
system calls between fork and exec, where CPython cannot run code without
``preexec_fn`` (a full fork, unsafe with threads). They need no loader and
no libc, so an exec costs ~0.1 ms. Each lives in a sealed memfd of the
covenant process (nothing on disk, nobody can modify it) and is executed as
``/proc/<covenant pid>/fd/<n>``.

The machine code of each helper is written here as commented byte pieces and
in ``covenant/runtime/asm/*.S`` as an assembly listing (GNU as);
``scripts/helper-bytes.sh`` assembles a listing with binutils and
``tests/runtime/test_helper_sources.py`` checks the two agree. Change both.
"""

from __future__ import annotations

import fcntl
import os
import platform
import struct
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "ABORT",
    "JNE",
    "JE",
    "Label",
    "Jump",
    "CREDENTIALS_LEN",
    "CLONE_NEWNS",
    "assemble",
    "credentials_block",
    "read_credentials",
    "become_credentials",
    "elf_image",
    "supported",
    "install_sealed",
]

_BASE = 0x400000
_HEADERS = 64 + 56
_MFD_EXEC = 0x0010
"""Linux >= 6.3: ask for an executable memfd explicitly (older kernels reject the flag)."""

class Label(NamedTuple):
    """A position in :func:`assemble`'s pieces that jumps can target."""

    name: str


class Jump(NamedTuple):
    """A rel32 conditional jump (``0f <opcode> rel32``) to a :class:`Label`."""

    opcode: int
    target: str


ABORT = Label("abort")
"""Where the abort code starts (exactly once in a program)."""
JNE = Jump(0x85, "abort")
"""``jne abort``."""
JE = Jump(0x84, "abort")
"""``je abort``."""

_JUMP_LEN = 6

Piece = bytes | Label | Jump


def assemble(pieces: Sequence[Piece]) -> bytes:
    """Concatenate machine code, resolving each :class:`Jump` to its :class:`Label`."""
    at = 0
    labels: dict[str, int] = {}
    for piece in pieces:
        if isinstance(piece, Label):
            labels[piece.name] = at
        else:
            at += _JUMP_LEN if isinstance(piece, Jump) else len(piece)
    out = bytearray()
    for piece in pieces:
        if isinstance(piece, Label):
            continue
        if isinstance(piece, Jump):
            if piece.target not in labels:
                raise ValueError(f"assemble: no label {piece.target!r}")
            rel = labels[piece.target] - (len(out) + _JUMP_LEN)
            out += bytes([0x0F, piece.opcode]) + struct.pack("<i", rel)
        else:
            out += piece
    return bytes(out)


CREDENTIALS_LEN = 24
"""Bytes :func:`read_credentials` reads from stdin first: uid, gid (u32), a namespace fd (i32, -1 =
none), the length of the cwd path that follows (u32, NUL included), the ``setns`` flags for that fd
(u32) and a Landlock ruleset fd (i32, -1 = none), little endian."""
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000


def credentials_block(
    uid: int, gid: int, namespace_fd: int = -1, cwd: str | None = None, *, setns_flags: int = CLONE_NEWNS,
    landlock_fd: int = -1,
) -> bytes:
    """What the launcher writes into the helper's stdin pipe before the spawn.

    ``namespace_fd``: a pidfd of a namespace holder (``setns_flags`` says which of its namespaces:
    ``CLONE_NEWNS``, ``CLONE_NEWNET`` or both) or one namespace file; the helper enters it and
    ``chdir``s to ``cwd``. ``landlock_fd``: a Landlock ruleset the helper enforces on itself after
    the switch to ``uid`` (``landlock_restrict_self``), so the agent's program starts confined.
    """
    path = b""
    if namespace_fd >= 0:
        if cwd is None:
            raise ValueError("a namespace needs the cwd to enter in it")
        path = os.fsencode(cwd) + b"\0"
        if len(path) > 4096:
            raise ValueError(f"cwd too long for the helper: {cwd!r}")
    return struct.pack("<IIiIIi", uid, gid, namespace_fd, len(path), setns_flags, landlock_fd) + path


def read_credentials() -> list[Piece]:
    """Code that reads the credentials from stdin and enters the agent's namespaces (still as root).

    Reads the :data:`CREDENTIALS_LEN` bytes of :func:`credentials_block`
    (the supervisor wrote them into the pipe before the spawn); a short
    read, uid 0 or gid 0 aborts. With a namespace fd it then reads the
    cwd path, ``setns(fd, flags)`` (the agent's private /tmp and /dev/shm,
    :mod:`covenant.runtime.mountns`, and its network,
    :mod:`covenant.runtime.netns`), closes the fd and
    ``chdir``s (setns moved it to the namespace's root). Any failing call
    aborts: fail closed. The block sits just below the stack pointer, the
    path 4 KiB further down (nothing else uses them). :func:`become_credentials`
    comes later: between the two the supervisor sets the rlimits and nice
    value from outside, which needs the process to still be root when
    covenant lacks CAP_SYS_RESOURCE (the systemd unit).
    """
    check = b"\x85\xc0"  # test %eax, %eax
    syscall = b"\x0f\x05"
    return [
        b"\x31\xc0",  # xor %eax, %eax            read
        b"\x31\xff",  # xor %edi, %edi            fd 0
        b"\x48\x8d\x74\x24\xe0",  # lea -32(%rsp), %rsi
        b"\xba\x18\x00\x00\x00",  # mov $24, %edx
        syscall,
        b"\x83\xf8\x18",  # cmp $24, %eax
        JNE,
        b"\x8b\x7c\x24\xe4",  # mov -28(%rsp), %edi    gid
        b"\x85\xff",  # test %edi, %edi
        JE,
        b"\x8b\x7c\x24\xe0",  # mov -32(%rsp), %edi    uid
        b"\x85\xff",  # test %edi, %edi
        JE,
        b"\x8b\x7c\x24\xe8",  # mov -24(%rsp), %edi    namespace fd
        b"\x83\xff\xff",  # cmp $-1, %edi
        Jump(0x84, "no_namespaces"),
        b"\x31\xc0",  # xor %eax, %eax            read the cwd
        b"\x31\xff",  # xor %edi, %edi
        b"\x48\x8d\xb4\x24\xc0\xef\xff\xff",  # lea -4160(%rsp), %rsi
        b"\x8b\x54\x24\xec",  # mov -20(%rsp), %edx    its length
        syscall,
        b"\x3b\x44\x24\xec",  # cmp -20(%rsp), %eax
        JNE,
        b"\x8b\x7c\x24\xe8",  # mov -24(%rsp), %edi
        b"\x8b\x74\x24\xf0",  # mov -16(%rsp), %esi    setns flags
        b"\xb8\x34\x01\x00\x00",  # mov $308, %eax        setns
        syscall,
        check,
        JNE,
        b"\x8b\x7c\x24\xe8",  # mov -24(%rsp), %edi
        b"\xb8\x03\x00\x00\x00",  # mov $3, %eax          close
        syscall,
        b"\x48\x8d\xbc\x24\xc0\xef\xff\xff",  # lea -4160(%rsp), %rdi
        b"\xb8\x50\x00\x00\x00",  # mov $80, %eax         chdir
        syscall,
        check,
        JNE,
        Label("no_namespaces"),
    ]


def become_credentials() -> list[Piece]:
    """Code that becomes the uid/gid :func:`read_credentials` read, for good.

    ``setgroups(0, NULL)`` (no supplementary groups), ``setgid``, ``setuid``
    (as root these set real, effective and saved ids), every capability
    dropped (ambient cleared, then ``capset`` to empty sets: a non-root
    daemon holding CAP_SETUID would otherwise pass it on), and
    ``PR_SET_NO_NEW_PRIVS`` so no set-uid program can give them back. Any
    failing call aborts. Last, with a Landlock ruleset fd in the block,
    ``landlock_restrict_self`` (which needs no_new_privs) and the fd closed:
    the program it execs starts confined. The kernel clears PR_SET_PDEATHSIG
    on a credential change: arm it after this.
    """
    check = b"\x85\xc0"  # test %eax, %eax
    syscall = b"\x0f\x05"
    return [
        b"\x31\xff",  # xor %edi, %edi
        b"\x31\xf6",  # xor %esi, %esi
        b"\xb8\x74\x00\x00\x00",  # mov $116, %eax        setgroups(0, NULL)
        syscall,
        check,
        JNE,
        b"\x8b\x7c\x24\xe4",  # mov -28(%rsp), %edi
        b"\xb8\x6a\x00\x00\x00",  # mov $106, %eax        setgid
        syscall,
        check,
        JNE,
        b"\x8b\x7c\x24\xe0",  # mov -32(%rsp), %edi
        b"\xb8\x69\x00\x00\x00",  # mov $105, %eax        setuid
        syscall,
        check,
        JNE,
        # A daemon that is not root but holds capabilities (the systemd unit) keeps them across a
        # setuid between two non-zero uids: drop every one, ambient first, then capset(all zero).
        b"\xbf\x2f\x00\x00\x00",  # mov $47, %edi         PR_CAP_AMBIENT
        b"\xbe\x04\x00\x00\x00",  # mov $4, %esi          PR_CAP_AMBIENT_CLEAR_ALL
        b"\x31\xd2",  # xor %edx, %edx
        b"\x45\x31\xd2",  # xor %r10d, %r10d
        b"\x45\x31\xc0",  # xor %r8d, %r8d
        b"\xb8\x9d\x00\x00\x00",  # mov $157, %eax        prctl
        syscall,
        check,
        JNE,
        b"\xc7\x44\x24\xa0\x22\x05\x08\x20",  # movl $0x20080522, -96(%rsp)   header: version 3
        b"\x31\xc0",  # xor %eax, %eax
        b"\x89\x44\x24\xa4",  # mov %eax, -92(%rsp)                      header: pid 0 (self)
        b"\x48\x89\x44\x24\xa8",  # mov %rax, -88(%rsp)                data: all zero
        b"\x48\x89\x44\x24\xb0",  # mov %rax, -80(%rsp)
        b"\x48\x89\x44\x24\xb8",  # mov %rax, -72(%rsp)
        b"\x48\x8d\x7c\x24\xa0",  # lea -96(%rsp), %rdi
        b"\x48\x8d\x74\x24\xa8",  # lea -88(%rsp), %rsi
        b"\xb8\x7e\x00\x00\x00",  # mov $126, %eax        capset
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
        b"\x8b\x7c\x24\xf4",  # mov -12(%rsp), %edi    Landlock ruleset fd
        b"\x83\xff\xff",  # cmp $-1, %edi
        Jump(0x84, "no_landlock"),
        b"\x31\xf6",  # xor %esi, %esi
        b"\xb8\xbe\x01\x00\x00",  # mov $446, %eax        landlock_restrict_self(fd, 0)
        syscall,
        check,
        JNE,
        b"\x8b\x7c\x24\xf4",  # mov -12(%rsp), %edi
        b"\xb8\x03\x00\x00\x00",  # mov $3, %eax          close
        syscall,
        Label("no_landlock"),
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
