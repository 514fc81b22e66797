# Become the uid and gid read_credentials.S left at -32(%rsp), for good: the code of
# covenant.runtime._elf.become_credentials(). No supplementary groups, real/effective/saved ids,
# every capability dropped, no_new_privs, then the Landlock ruleset at -12(%rsp) (if not -1)
# enforced. Jumps to `abort` on any failure. The kernel clears PR_SET_PDEATHSIG on a credential
# change: the includer arms it after this.

        xor     %edi, %edi
        xor     %esi, %esi
        mov     $116, %eax              # setgroups(0, NULL): no supplementary groups
        syscall
        test    %eax, %eax
        {disp32} jne abort
        mov     -28(%rsp), %edi
        mov     $106, %eax              # setgid (as root: real, effective and saved)
        syscall
        test    %eax, %eax
        {disp32} jne abort
        mov     -32(%rsp), %edi
        mov     $105, %eax              # setuid (as root: real, effective, saved; capabilities go)
        syscall
        test    %eax, %eax
        {disp32} jne abort
        mov     $47, %edi               # PR_CAP_AMBIENT: a non-root daemon holding capabilities
        mov     $4, %esi                # PR_CAP_AMBIENT_CLEAR_ALL   (the systemd unit) keeps them across
        xor     %edx, %edx              #   a setuid between two non-zero uids: drop every one,
        xor     %r10d, %r10d            #   ambient first,
        xor     %r8d, %r8d
        mov     $157, %eax              # prctl
        syscall
        test    %eax, %eax
        {disp32} jne abort
        movl    $0x20080522, -96(%rsp)  # then capset(header, data): header version 3,
        xor     %eax, %eax
        mov     %eax, -92(%rsp)         #   pid 0 (this process),
        mov     %rax, -88(%rsp)         #   and every set empty
        mov     %rax, -80(%rsp)
        mov     %rax, -72(%rsp)
        lea     -96(%rsp), %rdi
        lea     -88(%rsp), %rsi
        mov     $126, %eax              # capset
        syscall
        test    %eax, %eax
        {disp32} jne abort
        mov     $38, %edi               # PR_SET_NO_NEW_PRIVS: no set-uid program gives them back
        mov     $1, %esi
        xor     %edx, %edx
        xor     %r10d, %r10d
        xor     %r8d, %r8d
        mov     $157, %eax              # prctl
        syscall
        test    %eax, %eax
        {disp32} jne abort
        mov     -12(%rsp), %edi         # the Landlock ruleset fd
        cmp     $-1, %edi
        {disp32} je no_landlock
        xor     %esi, %esi
        mov     $446, %eax              # landlock_restrict_self(fd, 0): needs no_new_privs, set above
        syscall
        test    %eax, %eax
        {disp32} jne abort
        mov     -12(%rsp), %edi
        mov     $3, %eax                # close the ruleset fd
        syscall

no_landlock:
