# Read the agent's credentials and enter its namespaces, still as root: the code of
# covenant.runtime._elf.read_credentials(). Included by pdeathsig.S (credentialed variant) and
# uidkill.S; jumps to their `abort` label on any failure (fail closed). GNU as, x86-64, AT&T syntax.
#
# stdin first holds the 24-byte block of _elf.credentials_block(): uid, gid (u32), a namespace fd
# (i32, -1 = none: a pidfd of a namespace holder, or a namespace file), the length of the cwd path
# that follows (u32, NUL included), the setns(2) flags for that fd (u32) and a Landlock ruleset fd
# (i32, -1 = none), little endian. The block is read to -32(%rsp), the path to -4160(%rsp): below
# the stack pointer, where nothing else runs. become_credentials.S uses the uid, gid and ruleset fd
# it leaves at -32(%rsp), -28(%rsp) and -12(%rsp).
#
# Every conditional jump is written {disp32} because the Python pieces use the rel32 form
# (0f 8x + 4 bytes) whatever the distance (_elf.Jump); as would otherwise pick rel8 when it fits.

        xor     %eax, %eax              # read(0, block, 24)
        xor     %edi, %edi
        lea     -32(%rsp), %rsi
        mov     $24, %edx
        syscall
        cmp     $24, %eax
        {disp32} jne abort              # a short read: no credentials, no agent
        mov     -28(%rsp), %edi         # gid
        test    %edi, %edi
        {disp32} je abort               # never gid 0
        mov     -32(%rsp), %edi         # uid
        test    %edi, %edi
        {disp32} je abort               # never uid 0
        mov     -24(%rsp), %edi         # namespace fd
        cmp     $-1, %edi
        {disp32} je no_namespaces

        xor     %eax, %eax              # read(0, path, its length): the cwd inside the namespace
        xor     %edi, %edi
        lea     -4160(%rsp), %rsi
        mov     -20(%rsp), %edx
        syscall
        cmp     -20(%rsp), %eax
        {disp32} jne abort
        mov     -24(%rsp), %edi
        mov     -16(%rsp), %esi         # CLONE_NEWNS and/or CLONE_NEWNET
        mov     $308, %eax              # setns: the agent's private /tmp and /dev/shm, its network
        syscall
        test    %eax, %eax
        {disp32} jne abort
        mov     -24(%rsp), %edi
        mov     $3, %eax                # close the namespace fd
        syscall
        lea     -4160(%rsp), %rdi
        mov     $80, %eax               # chdir: setns moved us to the namespace's root
        syscall
        test    %eax, %eax
        {disp32} jne abort

no_namespaces:
