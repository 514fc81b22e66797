# The PDEATHSIG exec helper: the code of covenant.runtime.pdeathsig._code(pid, credentials).
# GNU as, x86-64, AT&T syntax. covenant/runtime/_elf.py wraps the bytes in a one-segment ELF
# (headers built field by field with struct) and runs it from a sealed memfd; see
# covenant/runtime/pdeathsig.py and docs/runtime.md ("PDEATHSIG", "The exec gate").
#
#     scripts/helper-bytes.sh pdeathsig 31337               # the plain helper for covenant pid 31337
#     scripts/helper-bytes.sh pdeathsig 31337 CREDENTIALS   # the variant that switches uid and gid
# print the bytes; tests/runtime/test_helper_sources.py checks they equal what covenant runs.
#
# COVENANT_PID is the daemon's pid, baked in when the helper is built. pdeathsig.py always encodes
# `cmp $pid, %eax` in its imm32 form (3d + 4 bytes) so any pid fits; as picks that same form for
# any pid above 127, which is what the test uses.
#
# On entry (the kernel's process start, no libc): (%rsp) = argc, 8(%rsp) = argv[0] (this helper),
# 16(%rsp) = argv[1] (the agent), then NULL, then envp.

        .text
        .globl  _start

        # PR_SET_PDEATHSIG, then check that covenant is still the parent.
        .macro  arm
        mov     $1, %edi                # PR_SET_PDEATHSIG
        mov     $9, %esi                # SIGKILL: die with the thread that spawned us
        xor     %edx, %edx
        mov     $157, %eax              # prctl
        syscall
        mov     $110, %eax              # getppid
        syscall
        cmp     $COVENANT_PID, %eax     # still covenant's child? (it may have died during the spawn,
        {disp32} jne abort              #   before the signal was armed: then never run the agent)
        .endm

        # The exec gate: one byte on stdin releases the agent.
        .macro  gate
        xor     %eax, %eax              # read(0, below the stack top, 1)
        xor     %edi, %edi
        lea     -8(%rsp), %rsi
        mov     $1, %edx
        syscall
        cmp     $1, %eax
        {disp32} jne abort              # end of file (or an error): the start was withdrawn
        .endm

_start:
.ifdef CREDENTIALS
        # Still root at the gate (covenant sets the rlimits then, which it may not do to a process of
        # another uid), the agent's uid after it; PDEATHSIG last, as a credential change clears it.
        .include "read_credentials.S"
        gate
        .include "become_credentials.S"
        arm
.else
        arm
        gate
.endif

        mov     (%rsp), %rcx            # argc
        lea     16(%rsp), %rsi          # argv + 1: the agent's argv
        mov     (%rsi), %rdi            # its path: argv[1]
        lea     16(%rsp,%rcx,8), %rdx   # envp = &argv[argc + 1]
        mov     $59, %eax               # execve: the agent replaces us, same pid
        syscall
        mov     $127, %edi              # execve failed: exit 127, as a shell does
        mov     $231, %eax              # exit_group
        syscall

abort:
        mov     $39, %eax               # getpid
        syscall
        mov     %eax, %edi
        mov     $9, %esi
        mov     $62, %eax               # kill(self, SIGKILL)
        syscall
