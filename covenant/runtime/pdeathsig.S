# The PDEATHSIG helper's code: the source of the bytes in covenant/runtime/pdeathsig.py (_code).
# GNU as, x86-64, AT&T syntax. covenant/runtime/pdeathsig.py wraps these bytes in a one-segment ELF
# (headers built with struct) and runs it from a sealed memfd; see that module and docs/runtime.md.
#
# Rebuild the bytes and compare them with the module:
#     scripts/pdeathsig-bytes.sh 31337          # hex of the code for covenant pid 31337
# tests/runtime/test_pdeathsig_source.py runs that and checks it equals pdeathsig._code(31337).
#
# COVENANT_PID is the daemon's pid, baked in when the helper is built (as --defsym). The module
# always encodes `cmp $pid, %eax` in its imm32 form (3d + 4 bytes) so that any pid fits; as picks
# that same form for any pid above 127, which is what the test uses.
#
# Registers on entry (the kernel's process start, no libc): (%rsp) = argc, 8(%rsp) = argv[0]
# (the helper's own path), 16(%rsp) = argv[1] (the agent), then NULL, then envp.

        .text
        .globl  _start
_start:
        mov     $1, %edi                # PR_SET_PDEATHSIG
        mov     $9, %esi                # SIGKILL: die with the thread that spawned us
        mov     $157, %eax              # prctl
        syscall
        mov     $110, %eax              # getppid
        syscall
        cmp     $COVENANT_PID, %eax     # still covenant's child? (it may have died during the spawn,
        jne     abort                   #   before the signal was armed: then never run the agent)

        xor     %eax, %eax              # read(0, below the stack top, 1): the exec gate
        xor     %edi, %edi
        lea     -8(%rsp), %rsi          # a byte of red zone nobody uses
        mov     $1, %edx
        syscall
        cmp     $1, %eax
        jne     abort                   # end of file (or an error): the start was withdrawn

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
