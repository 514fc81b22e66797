# The uid sweep helper: the code of covenant.runtime.uidkill._code(). GNU as, x86-64, AT&T syntax.
# Becomes the uid and gid given on stdin (read_credentials.S, become_credentials.S), then kill(-1, SIGKILL) twice: as
# that uid, the kernel signals every process of the uid in one pass (see uidkill.py for why twice
# and why this cannot be raced). Exits 0, or 1 when it could not become that uid.
#
#     scripts/helper-bytes.sh uidkill
# prints the bytes; tests/runtime/test_helper_sources.py checks they equal what covenant runs.

        .text
        .globl  _start
_start:
        .include "read_credentials.S"
        .include "become_credentials.S"
        mov     $-1, %edi               # every process we may signal
        mov     $9, %esi                # SIGKILL
        mov     $62, %eax               # kill
        syscall
        mov     $-1, %edi               # again: a fork that raced the first pass
        mov     $9, %esi
        mov     $62, %eax
        syscall
        xor     %edi, %edi
        mov     $231, %eax              # exit_group(0)
        syscall

abort:
        mov     $1, %edi
        mov     $231, %eax              # exit_group(1): could not become the uid
        syscall
